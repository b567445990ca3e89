"""`dataset`: train on a data set file (or directory, or cached Hugging Face data set) of prompts and reference
answers, scored by reward functions named in the TOML; no class to write.

    [[orchestrator.env]]
    id = "dataset"
    args = { path = "data/train.jsonl", rewards = { exact_match = 1.0, format_boxed = 0.1 } }

Rows come from `envs/data_files.py` (JSONL, JSON, CSV, parquet, a directory of them, a `save_to_disk`
directory, or a cached data set name; `split` picks the split). Each row becomes an `Example`:

- prompt: column `prompt_column` (default: the first of "prompt", "question", "messages" the rows have), a
  string (one user message, after `system_prompt` when set) or a list of {role, content} messages;
- answer: column `answer_column` (default "answer"), a string; `answer_column = ""`: none (code data sets, where
  the tests are the reference: the reward functions get "");
- info: every column of the row, passed to the reward functions by name (`fn(completion, answer, **row)`).

Every row is checked when the environment is made (at config time, before any process starts): a missing
column, a prompt or answer of the wrong type, no rows at all, or a row a configured reward cannot score (tests
that do not parse, a rubric field the row lacks) is one line naming the file, row and column.

Order: `examples(seed)` runs epoch after epoch forever; epoch e visits every row once, in the order of
`random.Random(f"{seed}:{e}").shuffle` (`shuffle = false`: file order every epoch). The n-th example of a seed
never changes, so a resumed run, which skips the examples drawn before its checkpoint, continues at exactly
the example an uninterrupted run would draw, across epoch boundaries too.
With `[orchestrator.curriculum]` the rows are instead drawn by their recent pass rates: example id `i` is row `i`
(`example_pool`).

Evaluation (`[orchestrator.eval]`) draws from `eval_path` / `eval_split` when set (held-out rows), else from
the training rows in another seed's order. Reward: sum of weight x function over `rewards`
(`envs/reward_functions.py`, with `reward_options = {<name> = {...}}` for the configured ones: `code_tests`,
`judge`); each function is logged as `reward/<env>/<name>`, and the components of a function that returns a
`Reward` as `reward/<env>/<name>/<component>`. A function that raises or returns anything but a finite number
fails the rollout under the environment's `on_error` rule.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Iterator
from typing import Any

from prime_rl.envs.data_files import RowRef, load_rows
from prime_rl.envs.environment import Environment, Example, Reward, chat_prompt
from prime_rl.envs.registry import register_env
from prime_rl.envs.reward_functions import RewardFn, resolve_rewards
from prime_rl.utils.errors import UserError

PROMPT_COLUMNS = ("prompt", "question", "messages")


def row_examples(rows: list[tuple[dict[str, Any], RowRef]], prompt_column: str | None, answer_column: str,
                 system_prompt: str) -> list[Example]:
    """Every row as an Example, or a one-line UserError naming the first bad row and column."""
    first = rows[0][0]
    column = prompt_column or next((c for c in PROMPT_COLUMNS if c in first), None)
    if column is None:
        raise UserError(f"{rows[0][1]}: no prompt column (looked for {', '.join(PROMPT_COLUMNS)}; columns: "
                        f"{', '.join(map(str, first))}): set prompt_column")
    examples = []
    for row, ref in rows:
        for name in (column, answer_column):
            if name and name not in row:
                raise UserError(f"{ref}: no column {name!r} (columns: {', '.join(map(str, row))})")
        answer = row[answer_column] if answer_column else ""
        if not isinstance(answer, str):
            raise UserError(f"{ref}: column {answer_column!r} is a {type(answer).__name__}, not a string "
                            f"({str(answer)[:50]!r}): write answers as strings")
        examples.append(Example(_prompt(row[column], system_prompt, ref, column), answer, dict(row)))
    return examples


def _prompt(value: Any, system_prompt: str, ref: RowRef, column: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return chat_prompt(system_prompt, value)
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        system = ([{"role": "system", "content": system_prompt}]
                  if system_prompt and value[0]["role"] != "system" else [])
        return [*system, *({"role": m["role"], "content": m["content"]} for m in value)]
    raise UserError(f"{ref}: column {column!r} must be a string or a non-empty list of {{role, content}} messages, "
                    f"got {str(value)[:60]!r}")


def check_rows(rewards: dict[str, tuple[RewardFn, float]], rows: list[tuple[dict[str, Any], RowRef]]) -> None:
    """Every row against every reward that can check one (`check_row(row)`, raising ValueError): one UserError
    naming the first row that fails."""
    checks = [(name, fn.check_row) for name, (fn, _) in rewards.items() if hasattr(fn, "check_row")]
    for row, ref in rows if checks else ():
        for name, check in checks:
            try:
                check(row)
            except (ValueError, TypeError, KeyError) as exc:
                raise UserError(f"{ref}: reward '{name}': {exc}") from None


def epochs(examples: list[Example], seed: int, shuffle: bool) -> Iterator[Example]:
    """`examples` epoch after epoch forever; epoch e shuffled by `random.Random(f"{seed}:{e}")`."""
    epoch = 0
    while True:
        order = list(range(len(examples)))
        if shuffle:
            random.Random(f"{seed}:{epoch}").shuffle(order)
        yield from (examples[i] for i in order)
        epoch += 1


@register_env
class DatasetEnv(Environment):
    id = "dataset"

    def __init__(self, path: str = "", split: str = "train", prompt_column: str = "", answer_column: str = "answer",
                 system_prompt: str = "", rewards: dict | None = None, extract: str = "auto",
                 normalize: list | None = None, shuffle: bool = True, eval_path: str = "", eval_split: str = "",
                 reward_options: dict | None = None):
        if not path:
            raise UserError("environment 'dataset' needs args.path (a data file, a directory or a data set name)")
        self.rewards: dict[str, tuple[RewardFn, float]] = resolve_rewards(
            rewards if rewards is not None else {"exact_match": 1.0}, extract,
            tuple(normalize if normalize is not None else ("strip", "whitespace")), self.id, reward_options)
        self.shuffle = shuffle

        def read(source: str, which: str) -> list[Example]:
            rows = load_rows(source, which)
            check_rows(self.rewards, rows)
            return row_examples(rows, prompt_column or None, answer_column, system_prompt)

        self.train = read(path, split)
        self.held_out = read(eval_path or path, eval_split or split) if (eval_path or eval_split) else None

    def examples(self, seed: int = 0) -> Iterator[Example]:
        return epochs(self.train, seed, self.shuffle)

    def eval_examples(self, seed: int = 0) -> Iterator[Example]:
        return epochs(self.held_out if self.held_out is not None else self.train, seed, self.shuffle)

    def example_pool(self) -> list[Example]:
        """The training rows, example id = the row's index in `path`'s `split` (file order)."""
        return self.train

    async def score(self, example: Example, completion: str) -> Reward:
        components, total = {}, 0.0
        row = {k: v for k, v in example.info.items() if k not in ("completion", "answer")}
        for name, (fn, weight) in self.rewards.items():
            value = fn(completion, example.answer, **row)
            if inspect.isawaitable(value):
                value = await value
            if isinstance(value, Reward):
                components.update({f"{name}/{part}": v for part, v in value.components.items()})
                value = value.total
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"reward '{name}' returned {value!r}, not a finite number")
            components[name] = float(value)
            total += weight * float(value)
        return Reward(total, components)
