"""Helpers shared by the tests (and the benchmarks that reuse them): imported as `tests.support.<module>`."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
SRC = REPO / "src"
TASKSETS = Path(__file__).resolve().parent / "tasksets"
"""verifiers tasksets, imported by verifiers as top-level packages named by their id: the verifiers tests put this
folder on sys.path (and on the PYTHONPATH of the processes they start)."""
