"""What one case of untrusted code may use (`Limits`) and what became of it (`CaseResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prime_rl.utils.errors import UserError

CASE_STATUSES = ("ok", "error", "timeout", "output_limit", "compile_error")


@dataclass(frozen=True)
class Limits:
    """Per case: `timeout_s` wall clock and CPU seconds, `memory_mib` of address space, `processes` (threads count
    too), `file_mib` per written file, `open_files`, `output_kib` of stdout (more: killed, `output_limit`); per
    evaluation: `tmp_mib` of scratch space (the tmpfs of the namespace levels)."""

    timeout_s: float = 5.0
    memory_mib: int = 1024
    processes: int = 32
    file_mib: int = 16
    open_files: int = 64
    output_kib: int = 1024
    tmp_mib: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mib", "processes", "file_mib", "open_files", "output_kib", "tmp_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise UserError(f"sandbox limit {name} must be a positive number, got {value!r}")
        if self.open_files < 8:
            raise UserError(f"sandbox limit open_files must be >= 8 (Python needs a few), got {self.open_files}")

    @property
    def tmp_bytes(self) -> int:
        return self.tmp_mib << 20

    @property
    def line_bytes(self) -> int:
        """The longest line the harness can write for one case (stdout and result at the cap, JSON-escaped x6)."""
        return 12 * (self.output_kib << 10) + (1 << 16)

    def evaluation_deadline(self, cases: int) -> float:
        """Seconds one evaluation of `cases` cases may take in all before the sandbox counts as hung."""
        return 10.0 + cases * (self.timeout_s + 1.0)

    def as_job(self) -> dict[str, Any]:
        return {"wall_s": self.timeout_s, "cpu_s": max(1, int(self.timeout_s + 0.999)),
                "memory_bytes": self.memory_mib << 20, "processes": self.processes, "file_bytes": self.file_mib << 20,
                "open_files": self.open_files, "output_bytes": self.output_kib << 10, "tmp_bytes": self.tmp_bytes}


@dataclass(frozen=True)
class CaseResult:
    """One case's run: `status` (CASE_STATUSES), the exit code, stdout (cut at the output limit), the `result` a
    call or assert case reported (JSON text; "" when none), stderr's tail, and the wall-clock seconds."""

    status: str
    exit_code: int | None = None
    stdout: str = ""
    result: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        status = data.get("status")
        if status not in CASE_STATUSES:
            raise ValueError(f"unknown case status {status!r}")
        return cls(status, data.get("exit_code"), str(data.get("stdout", "")), str(data.get("result", "")),
                   str(data.get("stderr", "")), float(data.get("seconds", 0.0)))
