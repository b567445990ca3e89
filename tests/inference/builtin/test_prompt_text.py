"""Text prompts are refused before they cost much when they cannot fit, and never refused when they fit."""

from __future__ import annotations

import random
import threading
import time

import pytest
from transformers import AutoTokenizer

from prime_rl.inference.builtin import prompt_text
from prime_rl.inference.builtin.prompt_text import PromptText, PromptTooLong, cut_before_whitespace


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_growth(fn) -> tuple[float, int, Exception | None]:
    """(seconds, largest growth of this process's resident memory while `fn` ran, what it raised)."""
    before, peak, done = resident_bytes(), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start, raised = time.monotonic(), None
    try:
        fn()
    except Exception as exc:
        raised = exc
    took = time.monotonic() - start
    done.set()
    watcher.join()
    return took, max(peak[0], resident_bytes()) - before, raised


def words(rng: random.Random, chars: int) -> str:
    vocabulary = ["the", "model", "reward", "tokens", "数学", "🙂", "1234567", "x_y", "\n", "  ", "Hello,", "é"]
    out, size = [], 0
    while size < chars:
        word = rng.choice(vocabulary)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


@pytest.mark.slow
def test_a_four_mib_prompt_at_a_32k_context_is_refused_in_under_a_second_without_growing_memory(qwen3):
    """The character bound alone lets 4.2 M characters through at a 32k context with Qwen3 (its longest token is
    128 characters): tokenizing 4 MiB in full took 20 s and 1.6 GB. Counted in pieces, it stops after a few
    contexts' worth of text."""
    text = words(random.Random(0), 4 * 2**20)
    encoder = PromptText(qwen3, 32768)
    assert len(text) < 32768 * encoder.longest  # the character bound does not catch it
    took, growth, raised = peak_growth(lambda: encoder.encode(text))
    assert isinstance(raised, PromptTooLong) and "exceeds the context length 32768" in str(raised)
    assert took < 1.0 and growth < 100 * 2**20, (took, growth / 2**20)


@pytest.mark.parametrize("seed", range(6))
def test_a_text_that_fits_is_never_refused_by_the_pieces_and_keeps_its_whole_tokenization(qwen3, monkeypatch, seed):
    """Counting in pieces only ever refuses: a text of exactly the context's length in tokens (cut into many
    pieces, some mid-word where no space is near) passes and gets the ids of the whole text."""
    monkeypatch.setattr(prompt_text, "SURELY_FITS", 0)  # every text is counted in pieces first
    monkeypatch.setattr(prompt_text, "WHITESPACE_SEARCH", 8)  # so some cuts fall inside a word
    rng = random.Random(seed)
    text = words(rng, 3000) + "=" * rng.randint(0, 300) + "abcdefghij" * rng.randint(0, 40) + words(rng, 500)
    ids = qwen3(text, add_special_tokens=False)["input_ids"]
    assert PromptText(qwen3, len(ids)).encode(text) == ids


def test_the_character_bound_refuses_without_tokenizing(qwen3, monkeypatch):
    encoder = PromptText(qwen3, 16)
    monkeypatch.setattr(encoder, "_ids", lambda text: pytest.fail("tokenized"))
    with pytest.raises(PromptTooLong, match=r"characters, so at least \d+ tokens\) exceeds the context length 16"):
        encoder.encode("a" * (16 * encoder.longest + 1))


def test_pieces_are_cut_before_whitespace_within_reach_and_always_advance(monkeypatch):
    monkeypatch.setattr(prompt_text, "WHITESPACE_SEARCH", 8)
    text = "abc def" + "x" * 50
    assert cut_before_whitespace(text, 0, 5) == 3
    assert cut_before_whitespace(text, 0, 40) == 40  # no whitespace within reach: cut where it is
    assert cut_before_whitespace(text, 3, 5) == 5  # never back to the piece's start
    assert cut_before_whitespace(text, 0, 100) == len(text)
