"""Splitting a completion into reasoning and answer: the `<think>` convention of Qwen3, DeepSeek-R1 and others.

For a completion text c and tags (start, end), e.g. ("<think>", "</think>"):

- c holds `end`: reasoning = the text before the last `end` (without a leading `start`), answer = the text
  after it, leading whitespace dropped (where Qwen3's template splits an assistant message). Qwen3 samples
  `<think>` itself; DeepSeek-R1 and Qwen3's 2507 thinking models have it in the generation prompt, so the
  completion may or may not begin with `start`: both split the same way.
- c never closes a reasoning block it opened (begins with `start`), or one the prompt opened (`opened`: the
  template ends the generation prompt with `start`): the budget ran out while thinking, all of c is reasoning
  and the answer is empty (`unfinished`).
- otherwise: no reasoning, the answer is c.

The reward scores the answer (`orchestrator.reasoning.score = "answer"`), so a correct answer after a long
thought earns what it would alone; the tokens trained are always the sampled ones, thinking included.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    reasoning: str | None  # None: the completion did not reason
    answer: str
    unfinished: bool = False  # reasoning opened and never closed


def split_reasoning(text: str, start: str = "<think>", end: str = "</think>", opened: bool = False) -> Split:
    """`text` split at the end of its reasoning (the module docstring)."""
    head = text.lstrip()
    if end in text:
        reasoning, answer = text.rsplit(end, 1)
        return Split(reasoning.lstrip().removeprefix(start).strip(), answer.lstrip())
    if opened or (start and head.startswith(start)):
        return Split(head.removeprefix(start).strip(), "", unfinished=True)
    return Split(None, text)
