"""`rl` restarts an inference server that dies or hangs (`deployment.max_restarts`).

A server child (the policy's, a teacher's, a judge's) that exits while the run goes on, or whose `/health` has not
answered for `hang_timeout_s` (a process stopped or stuck; asked every `PROBE_S` by a thread per server), or a
restarted one that has not answered within `startup_timeout_s`, is killed with its whole process group and started
again with the same command and port after a back-off of 2^(k-1) seconds for its k-th restart; `rl` says when it
answers again. More than `max_restarts` restarts of one server within `restart_window_s` end the run instead (one
line: the server, how it stopped, its log's last lines).

A policy server that gets its weights over NCCL (`weight_transfer.mode = "distributed"`) is not restarted: a new
process cannot join the trainer's process group; its death ends the run (or `rl.run_again` runs it again whole).

A restarted policy server serves the model's initial weights: the orchestrator notices (its answers carry an older
weight step than it loaded) and loads the newest weights on it before it samples again
(`orchestrator/servers.py`); its requests in flight are retried, by the client while the server is away
(`client.connect_timeout_s`; with several servers, on another one, and the restarted one is taken back).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from prime_rl.launch.processes import Child
from prime_rl.launch.rl_config import DeploymentConfig

PROBE_S = 2.0  # how often each server's /health is asked
PROBE_TIMEOUT_S = 5.0  # one /health answer later than this counts as none
BACKOFF_S = 1.0  # the wait before a server's first restart in the window, doubled for each later one


@dataclass
class _Server:
    child: Child
    health_url: str
    restartable: bool = True
    started: float = field(default_factory=time.monotonic)
    last_answer: float | None = None  # when /health last answered 200 since its (re)start
    restarts: deque[float] = field(default_factory=deque)  # when it was restarted, within the window
    restart_at: float | None = None  # a restart is due then (it died or hung)
    stopped: str = ""  # how it stopped, for the one line
    given_up: str | None = None  # why it is not restarted again
    back: bool = True  # whether it answered since its last restart (said once)


class ServerRestarts:
    """Watches the run's server children (a thread asks each one's /health every `PROBE_S`) and restarts the ones that
    died or hung (module docstring). `check` is called from `rl`'s supervision loop."""

    def __init__(self, servers: dict[str, tuple[Child, str]], rule: DeploymentConfig,
                 fixed: Collection[str] = ()):
        """`servers`: name -> (its child, its /health URL), each of which has just answered; `rule`: the restart keys
        (max_restarts, restart_window_s, hang_timeout_s, startup_timeout_s); `fixed`: servers never restarted."""
        self.rule = rule
        now = time.monotonic()
        self.servers = {name: _Server(child, url, name not in fixed, last_answer=now)
                        for name, (child, url) in servers.items()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe, args=(server,), name=f"rl-health-{name}", daemon=True)
                         for name, server in self.servers.items()]  # one each: a hung server delays no other's
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=PROBE_TIMEOUT_S + 1)

    def _probe(self, server: _Server) -> None:
        while not self._stop.wait(PROBE_S):
            if self._answers(server.health_url):
                with self._lock:
                    server.last_answer = time.monotonic()

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def hung_for(self, server: _Server, now: float) -> float | None:
        """How long past its limit `server` has gone without answering /health, or None (within it, or no limit): a
        server that answered since its (re)start has `hang_timeout_s` (none: no limit), one still starting
        `startup_timeout_s`."""
        with self._lock:
            last = server.last_answer
        if last is None:
            deadline = server.started + self.rule.startup_timeout_s
        elif self.rule.hang_timeout_s is None:
            return None
        else:
            deadline = last + self.rule.hang_timeout_s
        return now - deadline if now > deadline else None

    def check(self, name: str) -> str | None:
        """For server `name`, at one poll of the supervision loop: None while it serves or a restart is under way
        (one is started when due); else why the run must stop (it died or hung past its restarts)."""
        server, now = self.servers[name], time.monotonic()
        child = server.child
        if server.given_up is not None:
            return server.given_up
        if server.restart_at is not None:
            if now >= server.restart_at:
                self._restart(server, now)
            return None
        code = child.poll()
        if code is None and self.hung_for(server, now) is None:
            if not server.back and server.last_answer is not None:
                server.back = True
                print(f"rl: {name} answers again, {server.last_answer - server.started:.1f}s after its restart",
                      file=sys.stderr, flush=True)
            return None
        limit = "hang_timeout_s" if server.last_answer is not None else "startup_timeout_s"
        server.stopped = (f"exited with code {code}" if code is not None else
                          f"did not answer {server.health_url} for {getattr(self.rule, limit):g}s (deployment.{limit})")
        child.signal_group(signal.SIGKILL)  # a hung one, and what a dead one left behind
        while server.restarts and server.restarts[0] < now - self.rule.restart_window_s:
            server.restarts.popleft()
        if not server.restartable:
            server.given_up = (f"{server.stopped} (a server that gets its weights over NCCL, weight_transfer.mode = "
                               "'distributed', is not restarted)")
            return server.given_up
        if len(server.restarts) >= self.rule.max_restarts:
            restarts = f" after {len(server.restarts)} restart(s) within {self.rule.restart_window_s:g}s" \
                if self.rule.max_restarts else ""
            server.given_up = f"{server.stopped}{restarts} (deployment.max_restarts = {self.rule.max_restarts})"
            return server.given_up
        delay = BACKOFF_S * 2 ** len(server.restarts)
        server.restart_at = now + delay
        print(f"rl: warning: {name} {server.stopped}; restarting it in {delay:g}s (restart "
              f"{len(server.restarts) + 1} of {self.rule.max_restarts} within {self.rule.restart_window_s:g}s; see "
              f"{child.log_path})", file=sys.stderr, flush=True)
        return None

    def _restart(self, server: _Server, now: float) -> None:
        child = server.child
        if child.process is not None:
            try:
                child.process.wait(timeout=5)
            except Exception:  # noqa: BLE001  (a process that outlives SIGKILL is the kernel's; start anyway)
                pass
        with open(child.log_path, "a") as log:
            log.write(f"\n=== rl: restarting {child.name} ({server.stopped}) ===\n")
        child.start()
        with self._lock:
            server.started, server.last_answer = time.monotonic(), None
        server.restarts.append(now)
        server.restart_at, server.back = None, False
