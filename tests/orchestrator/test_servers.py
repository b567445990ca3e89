"""`ServerPool` (orchestrator/servers.py) over stand-in servers: requests spread by outstanding count, an
unreachable server is dropped with a warning and its request retried elsewhere, an answered error is not,
weight updates go to every server, no server left is one error, a dropped server that answers again is taken
back with the newest weights, and a restarted one is found by its answers' weight step and reloaded."""

from __future__ import annotations

import asyncio
import logging

import pytest

from prime_rl.orchestrator import servers as servers_module
from prime_rl.orchestrator.client import ChatResult, InferenceError
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.orchestrator.servers import ServerPool


class FakeServer:
    """Stands in for one InferenceClient: answers after `delay`, or fails as told."""

    def __init__(self, name: str, delay: float = 0.01, fail: str | None = None, step: int = 0):
        self.root, self.delay, self.fail, self.step = name, delay, fail, step
        self.chats, self.updates = 0, []
        self.context_len = None

    async def _answer(self):
        await asyncio.sleep(self.delay)
        if self.fail == "unreachable":
            raise InferenceError(f"inference server at {self.root} unreachable for 5s", unreachable=True)
        if self.fail == "400":
            raise InferenceError(f"inference server answered 400: bad request ({self.root})")

    async def chat(self, *args, **kwargs):
        await self._answer()
        self.chats += 1
        return ChatResult([1], self.step, [])

    async def served_step(self):
        await self._answer()
        return self.step

    async def update_weights(self, path, step, in_flight=False):
        await self._answer()
        self.updates.append(step)
        self.step = step
        return step

    async def wait_ready(self):
        await self._answer()
        return "tiny"


def pool_of(*servers: FakeServer, connect_timeout_s: float = 60.0) -> ServerPool:
    pool = ServerPool(ClientConfig(base_url=[f"http://127.0.0.1:{9000 + i}/v1" for i in range(len(servers))],
                                   connect_timeout_s=connect_timeout_s))
    pool.clients, pool.live = list(servers), list(servers)
    pool.outstanding = {id(s): 0 for s in servers}
    pool.answered = {id(s): 0 for s in servers}
    return pool


def chats(pool: ServerPool, count: int):
    return asyncio.run(_gather(pool, count))


async def _gather(pool, count):
    return await asyncio.gather(*(pool.chat([], 1, None, 1) for _ in range(count)))


def test_requests_spread_over_the_servers_by_outstanding_requests():
    a, b = FakeServer("a"), FakeServer("b")
    pool = pool_of(a, b)
    chats(pool, 10)
    assert (a.chats, b.chats) == (5, 5)
    assert pool.step_metrics() == {"rollout/servers_live": 2.0, "rollout/server_share_max": 0.5}
    slow, fast = FakeServer("slow", delay=0.2), FakeServer("fast", delay=0.001)
    pool = pool_of(slow, fast)
    async def one_by_one():
        first = asyncio.ensure_future(pool.chat([], 1, None, 1))  # occupies `slow`
        await asyncio.sleep(0)
        for _ in range(5):
            await pool.chat([], 1, None, 1)  # `slow` is busy: all go to `fast`
        await first
    asyncio.run(one_by_one())
    assert (slow.chats, fast.chats) == (1, 5)


def test_an_unreachable_server_is_dropped_with_a_warning_and_its_request_retried(caplog):
    dead, alive = FakeServer("dead", fail="unreachable"), FakeServer("alive")
    pool = pool_of(dead, alive)
    with caplog.at_level(logging.WARNING):
        results = chats(pool, 6)
    assert len(results) == 6 and alive.chats == 6 and pool.live == [alive]
    assert "inference server dead dropped" in caplog.text and "1 of 2 left" in caplog.text
    assert pool.step_metrics()["rollout/servers_live"] == 1.0


def test_an_answered_error_is_the_requests_not_the_servers():
    bad, good = FakeServer("bad", fail="400"), FakeServer("good")
    pool = pool_of(bad, good)
    with pytest.raises(InferenceError, match="400"):
        chats(pool, 2)
    assert pool.live == [bad, good]


def test_no_server_left_is_one_error_once_none_came_back_within_connect_timeout_s(monkeypatch):
    monkeypatch.setattr(servers_module, "REVIVE_PROBE_S", 0.01)
    pool = pool_of(FakeServer("a", fail="unreachable"), FakeServer("b", fail="unreachable"), connect_timeout_s=0.3)
    with pytest.raises(InferenceError, match="no inference server left") as caught:
        chats(pool, 1)
    assert "\n" not in str(caught.value) and "none came back within 0.3s" in str(caught.value)


def test_weight_updates_go_to_every_live_server_and_report_the_lowest_step():
    a, b, dead = FakeServer("a"), FakeServer("b", step=2), FakeServer("dead", fail="unreachable")
    pool = pool_of(a, b, dead)
    assert asyncio.run(pool.served_steps()) == [0, 2] and pool.live == [a, b]  # the dead one dropped on the way
    assert asyncio.run(pool.update_weights("/w/step_3", 3)) == 3
    assert a.updates == b.updates == [3]
    assert asyncio.run(pool.wait_ready()) == "tiny"


def test_one_url_is_a_plain_client_and_a_list_is_a_pool_config():
    assert ClientConfig().urls == ["http://127.0.0.1:8000/v1"]
    assert ClientConfig(base_url=["http://a:1/v1", "http://b:2/v1"]).urls == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(ValueError):
        ClientConfig(base_url=[])
    single = ServerPool(ClientConfig(connect_timeout_s=60))
    assert single.clients[0].config.connect_timeout_s == 60  # the only server is waited for as before
    several = ServerPool(ClientConfig(base_url=["http://a:1/v1", "http://b:2/v1"], connect_timeout_s=60))
    assert [c.config.connect_timeout_s for c in several.clients] == [5.0, 5.0]


def test_servers_at_different_steps_at_start_are_all_reloaded(tmp_path):
    """A fresh server at 0 beside a leftover at step 40 (another run's): the leftover must not be hidden."""
    from prime_rl.orchestrator.weight_sync import WeightSync

    fresh, leftover = FakeServer("fresh", step=0), FakeServer("leftover", step=40)
    sync = WeightSync(pool_of(fresh, leftover), tmp_path, max_async_level=1, timeout_s=5)
    asyncio.run(sync.align("/the/initial/model"))
    assert fresh.updates == leftover.updates == [0] and sync.served_step == 0
    agreeing = pool_of(FakeServer("a", step=0), FakeServer("b", step=0))
    asyncio.run(WeightSync(agreeing, tmp_path, max_async_level=1, timeout_s=5).align("/m"))
    assert [s.updates for s in agreeing.clients] == [[], []]  # nothing to reload


def test_every_server_dropped_is_one_error_for_updates_too(monkeypatch):
    monkeypatch.setattr(servers_module, "REVIVE_PROBE_S", 0.01)
    pool = pool_of(FakeServer("a", fail="unreachable"), FakeServer("b", fail="unreachable"), connect_timeout_s=0.3)
    with pytest.raises(InferenceError, match="no inference server left"):
        asyncio.run(pool.update_weights("/w/step_1", 1))
    with pytest.raises(InferenceError, match=r"no inference server left \(all 2 were dropped; none came back within"):
        asyncio.run(pool.served_steps())


def test_a_dropped_server_that_answers_again_is_taken_back_with_the_newest_weights(monkeypatch, caplog):
    """Both servers die (rl restarts them): requests wait for one to come back, which first gets the weights the
    pool loaded; then the other."""
    monkeypatch.setattr(servers_module, "REVIVE_PROBE_S", 0.01)
    a, b = FakeServer("a"), FakeServer("b")
    pool = pool_of(a, b)

    async def scenario():
        await pool.update_weights("/w/step_2", 2)
        a.fail = b.fail = "unreachable"
        waiting = asyncio.ensure_future(pool.chat([], 1, None, 1))
        while pool.live:
            await asyncio.sleep(0.01)
        a.fail, a.step = None, 0  # restarted: its initial weights
        result = await waiting
        b.fail, b.step = None, 0
        while len(pool.live) < 2:
            await asyncio.sleep(0.01)
        return result

    with caplog.at_level(logging.WARNING):
        result = asyncio.run(scenario())
    assert result.weight_step == 2 and a.updates[-1] == b.updates[-1] == 2 and pool.live == [a, b]
    assert "inference server a is back, serving weight step 2; 1 of 2 live" in caplog.text


def test_a_restarted_server_is_found_by_its_answers_and_reloaded_once(caplog):
    """The only server restarted between requests (the client's retries hid it): its answers come back under
    step 0; the pool loads step 3 on it once for all five requests and sends them again."""
    server = FakeServer("only")
    pool = pool_of(server)
    asyncio.run(pool.update_weights("/w/step_3", 3))
    server.step = 0
    with caplog.at_level(logging.WARNING):
        results = chats(pool, 5)
    assert [r.weight_step for r in results] == [3] * 5 and server.updates == [3, 3]
    assert caplog.text.count("it restarted; loading /w/step_3 again") == 1


def test_a_server_that_never_keeps_its_weights_is_one_error():
    class Forgetful(FakeServer):
        async def update_weights(self, path, step, in_flight=False):
            self.updates.append(step)
            return step  # and keeps serving step 0

    server = Forgetful("forgetful")
    pool = pool_of(server)
    asyncio.run(pool.update_weights("/w/step_1", 1))
    with pytest.raises(InferenceError, match="kept answering under weight step 0 after 3 loads of step 1"):
        chats(pool, 1)


def test_a_request_every_server_times_out_on_is_one_error_after_one_more_try(monkeypatch):
    """Servers that answer their health checks but never a generation in time (a timeout is unreachable): each is
    dropped, comes back, and the request tries them once more, then fails, instead of going round forever."""
    monkeypatch.setattr(servers_module, "REVIVE_PROBE_S", 0.01)

    class SlowToAnswer(FakeServer):
        async def chat(self, *args, **kwargs):
            self.chats += 1
            raise InferenceError(f"inference server at {self.root} did not answer within 1s", unreachable=True)

    a, b = SlowToAnswer("a"), SlowToAnswer("b")
    with pytest.raises(InferenceError, match="again after one came back"):
        chats(pool_of(a, b), 1)
    assert 2 <= a.chats + b.chats <= 4
