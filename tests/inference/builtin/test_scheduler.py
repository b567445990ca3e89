"""Admission between owners (`scheduler.Scheduler`) and how a running choice ends (`scheduler.Seq`), on plain
objects: no model, no torch tensors. The running batch is a list with one owner per running sequence."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future

import pytest

from prime_rl.inference.builtin.scheduler import PART, Request, SamplingParams, Scheduler, Seq, fail_rows

PARAMS = SamplingParams(max_tokens=4)


def parts(admitted: list[tuple[Request, int, int]]) -> list[tuple[object, int, int]]:
    """(owner, first choice, count) of each admitted part."""
    return [(request.owner, first, count) for request, first, count in admitted]


def test_a_newcomer_beside_one_owners_1024_choices_starts_at_the_first_free_slot():
    scheduler = Scheduler(max_batch_size=64)  # a quarter: 16
    flood = scheduler.submit([1, 2], PARAMS, n=1024, owner="flood")
    assert parts(scheduler.admit([])) == [("flood", 0, 64)]  # the whole batch, in one part
    scheduler.submit([3], PARAMS, n=8, owner="newcomer")
    assert scheduler.admit(["flood"] * 64) == []  # the batch is full
    assert parts(scheduler.admit(["flood"] * 63)) == [("newcomer", 0, 1)]  # crowded out: the first free slot
    # Running one now, it waits for its 7 others (fewer than a quarter) and holds the freed slots meanwhile.
    assert scheduler.admit(["flood"] * 62 + ["newcomer"]) == []
    assert scheduler.admit(["flood"] * 57 + ["newcomer"]) == []
    assert parts(scheduler.admit(["flood"] * 56 + ["newcomer"])) == [("newcomer", 1, 7)]
    assert list(scheduler.waiting) == ["flood"]
    assert parts(scheduler.admit(["flood"] * 48)) == [("flood", 64, 16)]  # the flood goes on where it stopped
    assert not flood.done()


def test_free_slots_go_to_the_owner_running_fewest_a_quarter_at_a_time():
    scheduler = Scheduler(max_batch_size=8)  # a quarter: 2
    scheduler.submit([1], PARAMS, n=8, owner="a")
    scheduler.submit([1], PARAMS, n=8, owner="b")
    # a (oldest) 2, b 2, a 2, b 2: one part per request, the slots alternating a quarter at a time.
    assert parts(scheduler.admit([])) == [("a", 0, 4), ("b", 0, 4)]
    assert parts(scheduler.admit(["a"] * 4 + ["b"] * 2)) == [("b", 4, 2)]  # b runs fewer: the freed quarter
    assert scheduler.admit(["a"] * 3 + ["b"] * 4) == []  # one slot is less than a quarter: a waits
    assert parts(scheduler.admit(["a"] * 2 + ["b"] * 4)) == [("a", 4, 2)]
    assert PART == 4


def test_a_batch_of_one_runs_requests_one_choice_at_a_time_oldest_first():
    scheduler = Scheduler(max_batch_size=1)  # a quarter of one slot is one slot
    scheduler.submit([1], PARAMS, n=3, owner="a")
    scheduler.submit([2], PARAMS, n=1, owner="b")
    assert parts(scheduler.admit([])) == [("a", 0, 1)]
    assert scheduler.admit(["a"]) == []
    # Ties (both run nothing) go to the oldest waiting request, so a's choices run before b's request.
    assert parts(scheduler.admit([])) == [("a", 1, 1)]
    assert parts(scheduler.admit([])) == [("a", 2, 1)]
    assert parts(scheduler.admit([])) == [("b", 0, 1)]
    assert scheduler.waiting == {}


def test_an_owner_with_nothing_left_neither_waits_nor_holds_slots():
    scheduler = Scheduler(max_batch_size=8)  # a quarter: 2
    failed = scheduler.submit([1], PARAMS, n=12, owner="a")
    assert parts(scheduler.admit([])) == [("a", 0, 8)]
    failed.set_exception(RuntimeError("a row of it failed"))  # its rows left the batch
    done_early = scheduler.submit([2], PARAMS, n=2, owner="b")
    scheduler.submit([3], PARAMS, n=2, owner="b")  # b's second request: after its first, in b's line
    # a runs nothing and is oldest, but its failed request starts no more choices: its line goes, b starts.
    assert parts(scheduler.admit([])) == [("b", 0, 2), ("b", 0, 2)]
    assert scheduler.waiting == {} and not done_early.done()
    # An owner running sequences with nothing waiting takes no slot: the newcomer gets all it asks.
    scheduler.submit([4], PARAMS, n=4, owner="c")
    assert parts(scheduler.admit(["b"] * 4)) == [("c", 0, 4)]


def test_nothing_running_nor_waiting_admits_nothing_after_a_short_wait():
    scheduler = Scheduler(max_batch_size=4)
    assert scheduler.admit([]) == [] and scheduler.waiting == {}


def test_a_request_without_owner_is_an_owner_of_its_own():
    scheduler = Scheduler(max_batch_size=4)
    scheduler.submit([1], PARAMS, n=1)
    scheduler.submit([1], PARAMS, n=1)
    scheduler.submit([1], PARAMS, n=1, owner="x")
    assert [owner for owner, _, _ in parts(scheduler.admit([]))] == [0, 1, "x"]


class CharTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


@pytest.mark.parametrize(("tokens", "params", "expected"), [
    ("ab", SamplingParams(max_tokens=4), None),
    ("abcd", SamplingParams(max_tokens=4), ("length", "abcd")),
    ("ab\0", SamplingParams(max_tokens=4), ("stop", "ab")),  # EOS (0): kept in the tokens, not in the text
    ("xSTO", SamplingParams(max_tokens=9, stop=("STOP",)), None),
    ("xSTOPy", SamplingParams(max_tokens=9, stop=("STOP",)), ("stop", "x")),
])
def test_a_choice_finishes_on_eos_a_stop_string_or_its_length(tokens, params, expected):
    request = Request([1], params, 1, Future())
    seq = Seq(request, 0, generator=None)
    for token in tokens:  # the engine asks after every sampled token
        seq.token_ids.append(ord(token))
        done = seq.finished(CharTokenizer(), eos_ids={0})
        if done:
            break
    assert done == expected


def test_a_request_resolves_with_its_last_choice_and_a_failed_row_fails_it_alone():
    scheduler = Scheduler(max_batch_size=4)
    ok, bad = scheduler.submit([1], PARAMS, n=2, owner="a"), scheduler.submit([2], PARAMS, n=1, owner="b")
    (a, _, _), (b, _, _) = scheduler.admit([])
    first, second, lone = Seq(a, 0, None, [5]), Seq(a, 1, None, [6]), Seq(b, 0, None, [7])
    second.complete("length", "six")
    assert not ok.done()
    first.complete("stop", "five")
    assert [(c.text, c.finish_reason) for c in ok.result(timeout=0)] == [("five", "stop"), ("six", "length")]
    fail_rows([lone], ValueError("sampling failed"))
    assert lone.failed and isinstance(bad.exception(timeout=0), ValueError)


def test_the_scheduler_imports_without_torch():
    code = "import sys, prime_rl.inference.builtin.scheduler; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
