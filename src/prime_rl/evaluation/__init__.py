"""The scoring behind `eval` (`held_out.py`): a builtin server and the orchestrator's evaluation in one process."""
