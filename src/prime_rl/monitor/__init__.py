"""One metric API: `Monitor.log(metrics, step)` fans out to JSONL, console and W&B."""

from prime_rl.monitor.monitor import Monitor

__all__ = ["Monitor"]
