"""A gated child waits for its parent's line on stdin; without the gate it goes on at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from prime_rl.utils.start_gate import START_GATE_ENV

GATED = ("import time; from prime_rl.utils.start_gate import wait_at_start_gate; "
         "wait_at_start_gate(); print('through', flush=True)")


def start(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", GATED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)


@pytest.mark.slow
def test_a_gated_child_waits_until_its_parent_writes_a_line(monkeypatch):
    child = start({**os.environ, START_GATE_ENV: "stdin"})
    time.sleep(1.0)
    assert child.poll() is None  # still at the gate
    out, _ = child.communicate("go\n", timeout=60)
    assert (child.returncode, out) == (0, "through\n")


def test_a_gate_closed_without_a_line_ends_the_child_quietly():
    child = start({**os.environ, START_GATE_ENV: "stdin"})
    out, _ = child.communicate("", timeout=60)  # end of input: the parent stopped the run
    assert (child.returncode, out) == (0, "")


def test_without_the_gate_the_child_goes_on_at_once():
    env = {k: v for k, v in os.environ.items() if k != START_GATE_ENV}
    child = start(env)  # stdin stays open and empty: a gate would block forever
    try:
        assert child.stdout.readline() == "through\n"
    finally:
        child.kill()
        child.communicate()
