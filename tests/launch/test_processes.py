"""`rl`'s children: a gated one goes on only when the launcher opens its gate, and opening it never fails."""

from __future__ import annotations

import os
import sys
import time

import pytest

from prime_rl.launch.processes import Child, stop_all

WAITS_AT_GATE = ("from prime_rl.utils.start_gate import wait_at_start_gate; wait_at_start_gate(); "
                 "print('through', flush=True)")


def child(tmp_path, code: str, gated: bool) -> Child:
    return Child("orchestrator", [sys.executable, "-c", code], tmp_path / "child.log", dict(os.environ), gated=gated)


@pytest.mark.slow
def test_a_gated_child_goes_on_when_its_gate_is_opened(tmp_path):
    gated = child(tmp_path, WAITS_AT_GATE, gated=True)
    gated.start()
    try:
        time.sleep(1.0)
        assert gated.running and gated.last_lines() == []
        gated.open_gate()
        gated.open_gate()  # a second time: nothing
        assert gated.process.wait(timeout=60) == 0
        assert gated.last_lines() == ["through"]
    finally:
        stop_all([gated])


def test_a_child_started_without_a_gate_does_not_wait(tmp_path):
    plain = child(tmp_path, WAITS_AT_GATE, gated=False)
    plain.start()
    assert plain.process.wait(timeout=60) == 0
    assert plain.last_lines() == ["through"]
    plain.open_gate()  # not gated: nothing


def test_opening_the_gate_of_a_child_that_died_or_never_started_is_harmless(tmp_path):
    never = child(tmp_path, "pass", gated=True)
    never.open_gate()
    dead = child(tmp_path, "import sys; sys.exit(3)", gated=True)
    dead.start()
    assert dead.process.wait(timeout=60) == 3
    dead.open_gate()  # its stdin's reader is gone: a broken pipe, swallowed
    assert dead.poll() == 3
