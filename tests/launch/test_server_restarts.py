"""`rl`'s restarts of an inference server (launch/server_restarts.py) on a stand-in server process: one that dies is
started again after its back-off and answers again, one that hangs (SIGSTOP) is killed and restarted, one that dies
at every start ends the run after `max_restarts` with one line, and with `max_restarts = 0` the first death does."""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request

import pytest

from prime_rl.launch import server_restarts
from prime_rl.launch.processes import Child, stop_all
from prime_rl.launch.rl_config import DeploymentConfig
from prime_rl.launch.server_restarts import ServerRestarts
from prime_rl.utils.net import free_port

SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A started stand-in server child and its /health URL; stopped at the end."""
    monkeypatch.setattr(server_restarts, "PROBE_S", 0.05)
    monkeypatch.setattr(server_restarts, "BACKOFF_S", 0.05)
    port = free_port()
    child = Child("inference", [sys.executable, "-c", SERVER, str(port)], tmp_path / "inference.log", dict(os.environ))
    child.start()
    url = f"http://127.0.0.1:{port}/health"
    wait_for(lambda: answers(url), 30)
    yield child, url
    stop_all([child], grace_s=1)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(condition, timeout_s: float, each=None):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        if each is not None:
            each()
        time.sleep(0.02)


def supervise_until(restarts: ServerRestarts, condition, timeout_s: float = 30) -> list[str]:
    """Call `check` as rl's loop does until `condition()`; every answer that was not None."""
    stops: list[str] = []

    def poll():
        if (why := restarts.check("inference")) is not None:
            stops.append(why)
    wait_for(lambda: condition() or bool(stops), timeout_s, poll)
    return stops


def test_a_server_that_dies_is_restarted_after_its_back_off_and_answers_again(server, capsys):
    child, url = server
    restarts = ServerRestarts({"inference": (child, url)}, DeploymentConfig(max_restarts=2))
    said: list[str] = []

    def back() -> bool:  # rl says when its probe sees the restarted server answer
        said.append(capsys.readouterr().err)
        return "rl: inference answers again" in "".join(said)
    try:
        first = child.process.pid
        os.kill(first, signal.SIGKILL)
        stops = supervise_until(restarts, lambda: child.process.pid != first and answers(url) and back())
    finally:
        restarts.close()
    assert stops == []
    said = "".join(said)
    assert "rl: warning: inference exited with code -9; restarting it in 0.05s (restart 1 of 2 within 3600s" in said
    assert said.count("answers again") == 1
    assert "=== rl: restarting inference (exited with code -9) ===" in child.log_path.read_text()


def test_a_hung_server_is_killed_and_restarted(server):
    child, url = server
    rule = DeploymentConfig(max_restarts=1).model_copy(update={"hang_timeout_s": 0.5})  # below the config's floor
    restarts = ServerRestarts({"inference": (child, url)}, rule)
    try:
        hung = child.process
        os.kill(hung.pid, signal.SIGSTOP)
        stops = supervise_until(restarts, lambda: child.process is not hung and answers(url))
    finally:
        restarts.close()
    assert stops == [] and hung.poll() == -signal.SIGKILL  # killed, not left stopped
    assert "did not answer" in child.log_path.read_text() and "hang_timeout_s" in child.log_path.read_text()


def test_a_server_that_dies_at_every_start_stops_the_run_after_max_restarts(server):
    child, url = server
    restarts = ServerRestarts({"inference": (child, url)}, DeploymentConfig(max_restarts=2))
    try:
        child.command = [sys.executable, "-c", "raise SystemExit(3)"]  # what a restart runs from now on
        os.kill(child.process.pid, signal.SIGKILL)
        stops = supervise_until(restarts, lambda: False)
    finally:
        restarts.close()
    assert stops == ["exited with code 3 after 2 restart(s) within 3600s (deployment.max_restarts = 2)"]
    assert child.poll() == 3 and restarts.check("inference") == stops[0]  # given up: the same line every poll


def test_without_restarts_the_first_death_stops_the_run(server):
    child, url = server
    restarts = ServerRestarts({"inference": (child, url)}, DeploymentConfig(max_restarts=0))
    try:
        os.kill(child.process.pid, signal.SIGKILL)
        stops = supervise_until(restarts, lambda: False)
    finally:
        restarts.close()
    assert stops == ["exited with code -9 (deployment.max_restarts = 0)"]


def test_a_hung_server_delays_no_other_servers_health(server, tmp_path):
    """Each server is asked by its own thread: while one is stopped (its /health never answers), the other still
    answers every probe and is never taken for hung."""
    child, url = server
    port = free_port()
    other = Child("inference_1", [sys.executable, "-c", SERVER, str(port)], tmp_path / "other.log", dict(os.environ))
    other.start()
    other_url = f"http://127.0.0.1:{port}/health"
    wait_for(lambda: answers(other_url), 30)
    rule = DeploymentConfig(max_restarts=0).model_copy(update={"hang_timeout_s": 1.0})
    restarts = ServerRestarts({"inference": (child, url), "inference_1": (other, other_url)}, rule)
    try:
        os.kill(child.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert restarts.check("inference_1") is None
            time.sleep(0.05)
        assert restarts.check("inference").startswith(f"did not answer {url} for 1s (deployment.hang_timeout_s)")
    finally:
        restarts.close()
        stop_all([other], grace_s=1)


def test_without_a_hang_limit_a_restart_that_never_answers_is_still_found(server):
    """hang_timeout_s = none: a running server is never judged by its /health, but a restarted one that does not
    answer within startup_timeout_s is (as the first start is by rl's wait for /health)."""
    child, url = server
    rule = DeploymentConfig(max_restarts=1, hang_timeout_s=None).model_copy(update={"startup_timeout_s": 0.5})
    restarts = ServerRestarts({"inference": (child, url)}, rule)
    try:
        child.command = [sys.executable, "-c", "import time; time.sleep(60)"]  # starts, never serves
        os.kill(child.process.pid, signal.SIGKILL)
        stops = supervise_until(restarts, lambda: False)
    finally:
        restarts.close()
    assert stops == [f"did not answer {url} for 0.5s (deployment.startup_timeout_s) after 1 restart(s) within 3600s "
                     "(deployment.max_restarts = 1)"]
