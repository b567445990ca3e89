"""Running untrusted code (the policy's programs) with limits and isolation: `LocalSandbox` on this machine
(bubblewrap, kernel namespaces, or explicitly none), `FusionSandbox` through a SandboxFusion server."""

from prime_rl.sandbox.limits import CaseResult, Limits
from prime_rl.sandbox.local import LocalSandbox, SandboxFailed, choose_level

__all__ = ["CaseResult", "Limits", "LocalSandbox", "SandboxFailed", "choose_level"]
