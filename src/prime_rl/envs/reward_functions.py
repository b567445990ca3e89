"""Reward functions named in a TOML file (`rewards = {exact_match = 1.0, format_boxed = 0.1}`), each a
function `fn(completion, answer, **row) -> float`: the completion's text (its answer part: the orchestrator
already removed a `<think>` block), the row's reference answer, and every column of the row by name.

Built-ins (`builtin_rewards`), all in [0, 1]:

- `exact_match`: 1 if the extracted answer equals the reference after normalisation (`normalize`: any of
  "strip", "whitespace" (runs of whitespace become one space), "lower", "punctuation" (removed));
- `numeric_match`: 1 if the last number in the extracted answer equals the reference's number
  (|a - b| <= 1e-6 * max(1, |b|); "1,000" reads as 1000, "1/2" as 0.5);
- `lcs_ratio`: partial credit for text, 2 * LCS / (len(answer) + len(reference)) over the characters of the
  extracted, normalised answer and reference (1 only for an exact match; `envs/rewards.py`);
- `format_answer_tags`: 1 if the completion holds an `<answer>...</answer>` block;
- `format_boxed`: 1 if the completion holds a `\\boxed{...}`;
- `math_verify`: 1 if math-verify (the library TRL and open-r1 use; `pip install prime-rl[math]`) finds the
  completion's answer mathematically equal to the reference (`\\boxed{1/2}` equals `0.5` and `\\frac12`).

The answer is extracted from the completion by `extract`: "answer_tags" (the last `<answer>` block),
"boxed" (the last `\\boxed{...}`, braces balanced), "last_line" (the last non-empty line), "last_number" (the
last number as written, thousands commas removed: "4 - 6 = -2." -> "-2"; "" when there is none), "none" (the whole
text), or "auto" (answer tags if any, else a box if any, else the whole text).

Configured built-ins take a table of options (`reward_options = {<name> = {...}}`) and return a `Reward` whose
components are logged as `reward/<env>/<name>/<component>`:

- `code_tests`: the fraction of the row's tests the completion's program passes, run in a sandbox
  (`envs/code_tests.py`);
- `judge`: a judge model's score of the completion under a rubric (`envs/judge.py`).

Anything else is an import path, `"pkg.module:fn"`, called with the raw completion (sync or async); it may return
a number or a `Reward`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

from prime_rl.envs.code_tests import code_tests_reward
from prime_rl.envs.judge import judge_reward
from prime_rl.envs.rewards import last_number, parse_number
from prime_rl.envs.rewards import lcs_ratio as _lcs_ratio
from prime_rl.utils.errors import UserError
from prime_rl.utils.imports import import_object

EXTRACTIONS = ("auto", "answer_tags", "boxed", "last_line", "last_number", "none")
NORMALIZATIONS = ("strip", "whitespace", "lower", "punctuation")
_ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

RewardFn = Callable[..., Any]
CONFIGURED: dict[str, Callable[[dict[str, Any], str], RewardFn]] = {"code_tests": code_tests_reward,
                                                                     "judge": judge_reward}
"""Built-ins made from their options (a table in `reward_options`, may be empty): name -> factory(options, env)."""


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def extract_answer(text: str, how: str = "auto") -> str:
    """The answer part of a completion (module docstring)."""
    tagged = _ANSWER_TAGS.findall(text) if how in ("auto", "answer_tags") else []
    if tagged:
        return tagged[-1]
    boxed = last_boxed(text) if how in ("auto", "boxed") else None
    if boxed is not None:
        return boxed
    if how == "last_line":
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else ""
    if how == "last_number":
        return last_number(text) or ""
    return "" if how in ("answer_tags", "boxed") else text


def normalize(text: str, steps: tuple[str, ...]) -> str:
    if "lower" in steps:
        text = text.lower()
    if "punctuation" in steps:
        text = text.translate(str.maketrans("", "", string.punctuation))
    if "whitespace" in steps:
        text = " ".join(text.split())
    if "strip" in steps:
        text = text.strip()
    return text


def _math_verify(completion: str, answer: str) -> float:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise UserError("reward 'math_verify' needs the math-verify package: pip install prime-rl[math]") from None
    gold = parse(answer if "\\boxed" in answer or "$" in answer else f"${answer}$")
    return float(verify(gold, parse(completion)))


def builtin_rewards(extract: str, steps: tuple[str, ...]) -> dict[str, RewardFn]:
    """The built-in reward functions under these extraction and normalisation options."""

    def exact_match(completion: str, answer: str, **_: Any) -> float:
        return float(normalize(extract_answer(completion, extract), steps) == normalize(answer, steps))

    def numeric_match(completion: str, answer: str, **_: Any) -> float:
        got, want = parse_number(extract_answer(completion, extract)), parse_number(answer)
        return float(got is not None and want is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want)))

    def lcs_ratio(completion: str, answer: str, **_: Any) -> float:
        return _lcs_ratio(normalize(answer, steps), normalize(extract_answer(completion, extract), steps))

    def format_answer_tags(completion: str, answer: str, **_: Any) -> float:
        return float(bool(_ANSWER_TAGS.search(completion)))

    def format_boxed(completion: str, answer: str, **_: Any) -> float:
        return float(last_boxed(completion) is not None)

    def math_verify(completion: str, answer: str, **_: Any) -> float:
        return _math_verify(completion, answer)

    return {f.__name__: f for f in (exact_match, numeric_match, lcs_ratio, format_answer_tags, format_boxed,
                                    math_verify)}


def resolve_rewards(rewards: dict[str, float], extract: str = "auto", steps: tuple[str, ...] = ("strip",),
                    env_id: str = "dataset", options: dict[str, Any] | None = None
                    ) -> dict[str, tuple[RewardFn, float]]:
    """name -> (function, weight) for a `rewards` table (and the `reward_options` of its configured built-ins); an
    unknown name or a bad option is a one-line UserError."""
    options = options or {}
    stray = sorted(set(options) - (set(rewards) & set(CONFIGURED)))
    if stray:
        raise UserError(f"environment '{env_id}': reward_options for {', '.join(stray)}, which "
                        f"{'is' if len(stray) == 1 else 'are'} not a configured reward in rewards "
                        f"(configured: {', '.join(CONFIGURED)})")
    for name, table in options.items():
        if not isinstance(table, dict):
            raise UserError(f"environment '{env_id}': reward_options.{name} must be a table, got {table!r}")
    if extract not in EXTRACTIONS:
        raise UserError(f"environment '{env_id}': extract must be one of {', '.join(EXTRACTIONS)}, not {extract!r}")
    unknown_steps = sorted(set(steps) - set(NORMALIZATIONS))
    if unknown_steps:
        raise UserError(f"environment '{env_id}': unknown normalize step(s) {', '.join(unknown_steps)} "
                        f"(allowed: {', '.join(NORMALIZATIONS)})")
    if not rewards:
        raise UserError(f"environment '{env_id}': rewards is empty (e.g. rewards = {{exact_match = 1.0}})")
    builtins = builtin_rewards(extract, steps)
    resolved = {}
    for name, weight in rewards.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise UserError(f"environment '{env_id}': the weight of reward '{name}' must be a number, got {weight!r}")
        if name in builtins:
            resolved[name] = (builtins[name], float(weight))
        elif name in CONFIGURED:
            resolved[name] = (CONFIGURED[name](options.get(name, {}), env_id), float(weight))
        elif ":" in name:
            try:
                resolved[name] = (import_object(name), float(weight))
            except ValueError as exc:
                raise UserError(f"environment '{env_id}': reward {exc}") from None
        else:
            raise UserError(f"environment '{env_id}': unknown reward '{name}' (built-ins: "
                            f"{', '.join([*builtins, *CONFIGURED])}; or 'pkg.module:fn')")
    return resolved
