"""The `code_tests` reward: run the completion's program against the example's tests in a sandbox.

    rewards = { code_tests = 1.0 }
    code_tests = { mode = "fraction", sandbox = "auto", timeout_s = 5 }      # options, all optional

The program is the last fenced block of the completion in the language (```python, ```py, ```python3 or an
unlabelled fence); with `fenced_only = false` a completion without any fence is taken whole. The tests come from
the row's `tests_column` (default: the first of TEST_COLUMNS the row has), a JSON string or the value itself:

- stdin/stdout (APPS, TACO: `input_output`): {"inputs": [...], "outputs": [...]}; each input is the program's
  stdin, each output its expected stdout (a list of lines is joined by newlines);
- call-based: the same with "fn_name" (or the row's `fn_name`/`entry_point` column, or `metadata.func_name`):
  inputs[i] are the arguments of `fn` (a top-level function, or a method of `Solution()`), outputs[i] the value it
  returns (APPS wraps it in a one-element list: either matches);
- LiveCodeBench: [{"input", "output", "testtype": "stdin" | "functional"}]; a functional input is one JSON value
  per line (the arguments), its output one JSON value;
- assert-style: a string of test code (one case) or a list of them (one case each, as MBPP's `test_list`),
  run after the solution in its namespace; the case passes when the test code runs to its end.

Matching: stdout equals the expected output after removing trailing whitespace from every line and trailing
blank lines, or else token by token with numbers equal within 1e-6 (relative, at least absolute); returned values
equal as JSON, numbers within 1e-6. Reward: the fraction of cases passed (`mode = "fraction"`) or 1 only when all
pass (`mode = "all"`, which stops at the first failure). Components (fractions of the cases): `passed`,
`wrong_answer`, `runtime_error`, `timeout`, `output_limit`, `compile_error`, and `no_code` (1 when no program was
found). Limits and isolation: `sandbox/`; docs/environments.md, "Rewards for code".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from prime_rl.envs.environment import Reward
from prime_rl.envs.rewards import typed_options
from prime_rl.sandbox import CaseResult, Limits, LocalSandbox
from prime_rl.sandbox.fusion import FusionSandbox
from prime_rl.utils.errors import UserError

TEST_COLUMNS = ("tests", "input_output", "test_cases", "public_test_cases", "test_list", "test")
FN_NAME_COLUMNS = ("fn_name", "entry_point")
LANGUAGE_TAGS = {"python": ("python", "py", "python3", "")}
MODES = ("fraction", "all")
OUTCOMES = ("passed", "wrong_answer", "runtime_error", "timeout", "output_limit", "compile_error")
_FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class TestCase:
    """What the sandbox runs (`job`: {"kind": "stdio", "stdin"} | {"kind": "call", "fn", "args"} | {"kind":
    "assert", "code"}) and what it must give (`expected`: stdout text, a JSON value, or None for asserts)."""

    job: dict[str, Any]
    expected: Any = None


def extract_code(completion: str, language: str = "python", fenced_only: bool = True) -> str | None:
    """The last fenced block in `language` (or unlabelled); without any fence, the whole completion unless
    `fenced_only`; None when there is no program."""
    tags = LANGUAGE_TAGS[language]
    blocks = [body for tag, body in _FENCE.findall(completion) if tag.lower() in tags]
    if blocks:
        return blocks[-1]
    if fenced_only or "```" in completion or not completion.strip():
        return None
    return completion


def parse_tests(value: Any, fn_name: str | None = None) -> list[TestCase]:
    """The cases of one row's tests in any format of the module docstring; ValueError naming what is wrong."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return [TestCase({"kind": "assert", "code": value})]
        return [TestCase({"kind": "assert", "code": value})] if isinstance(decoded, str) else parse_tests(
            decoded, fn_name)
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        inputs, outputs = value["inputs"], value["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError("tests need as many 'inputs' as 'outputs' (two lists)")
        fn = value.get("fn_name") or fn_name
        if fn:
            return [TestCase({"kind": "call", "fn": fn, "args": json.dumps(args if isinstance(args, list) else [args])},
                             out) for args, out in zip(inputs, outputs, strict=True)]
        return [TestCase({"kind": "stdio", "stdin": _text(i)}, _text(o)) for i, o in zip(inputs, outputs, strict=True)]
    if isinstance(value, list) and value and all(isinstance(t, dict) and "input" in t and "output" in t
                                                 for t in value):
        return [_livecodebench_case(t, fn_name) for t in value]
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return [TestCase({"kind": "assert", "code": t}) for t in value]
    raise ValueError(f"unknown test format {str(value)[:80]!r} (docs/environments.md, \"Rewards for code\")")


def _livecodebench_case(test: dict[str, Any], fn_name: str | None) -> TestCase:
    if test.get("testtype") == "functional":
        if not fn_name:
            raise ValueError("a functional test needs the function's name (fn_name, or metadata.func_name)")
        args = [json.loads(line) for line in str(test["input"]).splitlines() if line.strip()]
        return TestCase({"kind": "call", "fn": fn_name, "args": json.dumps(args)}, json.loads(test["output"]))
    return TestCase({"kind": "stdio", "stdin": _text(test["input"])}, _text(test["output"]))


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def row_fn_name(row: dict[str, Any]) -> str | None:
    """The function call-based tests call, from the row's own columns (module docstring)."""
    for column in FN_NAME_COLUMNS:
        if isinstance(row.get(column), str) and row[column]:
            return row[column]
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            return None
    return metadata.get("func_name") if isinstance(metadata, dict) else None


def outputs_match(got: str, expected: str) -> bool:
    """Module docstring: lines without trailing whitespace and trailing blank lines, else tokens (numbers close)."""
    def lines(text: str) -> list[str]:
        kept = [line.rstrip() for line in text.splitlines()]
        while kept and not kept[-1]:
            kept.pop()
        return kept

    if lines(got) == lines(expected):
        return True
    got_tokens, expected_tokens = got.split(), expected.split()
    return len(got_tokens) == len(expected_tokens) and all(
        a == b or _numbers_close(a, b) for a, b in zip(got_tokens, expected_tokens, strict=True))


def _numbers_close(a: Any, b: Any) -> bool:
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6)


def values_match(got: Any, expected: Any) -> bool:
    """JSON values equal, numbers within 1e-6 (bools are not numbers here)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return isinstance(got, bool) and isinstance(expected, bool) and got == expected
    if isinstance(got, int | float) and isinstance(expected, int | float):
        return got == expected or _numbers_close(got, expected)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(a, b) for a, b in zip(got, expected, strict=True))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return got == expected


def outcome(case: TestCase, result: CaseResult) -> str:
    """One of OUTCOMES for a case and its run."""
    if result.status == "ok":
        if case.job["kind"] == "stdio":
            return "passed" if outputs_match(result.stdout, case.expected) else "wrong_answer"
        try:
            got = json.loads(result.result)
        except json.JSONDecodeError:
            return "runtime_error"
        if case.job["kind"] == "assert":
            return "passed" if got is True else "runtime_error"
        wrapped = isinstance(case.expected, list) and len(case.expected) == 1
        return "passed" if values_match(got, case.expected) or (wrapped and values_match(got, case.expected[0])) \
            else "wrong_answer"
    if result.status == "error":
        last = result.stderr.strip().splitlines()[-1:] or [""]
        if last[0].startswith(("SyntaxError", "IndentationError", "TabError")):
            return "compile_error"
        if case.job["kind"] == "assert" and last[0].startswith("AssertionError"):
            return "wrong_answer"
        return "runtime_error"
    return {"timeout": "timeout", "output_limit": "output_limit", "compile_error": "compile_error"}[result.status]


@dataclass(frozen=True)
class CodeTestsOptions(Limits):
    """`reward_options.code_tests` (module docstring): the sandbox's `Limits` and these."""

    tests_column: str = ""
    fn_name: str = ""
    language: str = "python"
    fenced_only: bool = True
    mode: str = "fraction"
    sandbox: str = "auto"
    url: str = ""
    max_concurrency: int = 4

    @classmethod
    def parse(cls, options: dict[str, Any], env_id: str) -> CodeTestsOptions:
        parsed = typed_options(cls, options, lambda why: UserError(f"environment '{env_id}': code_tests {why}"))
        if parsed.language not in LANGUAGE_TAGS:
            raise UserError(f"environment '{env_id}': code_tests language must be one of "
                            f"{', '.join(LANGUAGE_TAGS)}, not {parsed.language!r}")
        if parsed.mode not in MODES:
            raise UserError(f"environment '{env_id}': code_tests mode must be one of {', '.join(MODES)}, "
                            f"not {parsed.mode!r}")
        if parsed.sandbox == "sandbox_fusion" and not parsed.url:
            raise UserError(f"environment '{env_id}': code_tests sandbox = \"sandbox_fusion\" needs url "
                            "(the server's address, e.g. \"http://127.0.0.1:8080\")")
        return parsed

    @property
    def limits(self) -> Limits:
        return Limits(**{f.name: getattr(self, f.name) for f in fields(Limits)})


class CodeTests:
    """The `code_tests` reward function: `await CodeTests(options)(completion, answer, **row) -> Reward`."""

    __name__ = "code_tests"

    def __init__(self, options: CodeTestsOptions):
        self.options = options
        if options.sandbox == "sandbox_fusion":
            self.sandbox: LocalSandbox | FusionSandbox = FusionSandbox(
                options.url, options.limits, options.max_concurrency)
        else:
            self.sandbox = LocalSandbox(options.sandbox, options.limits, options.max_concurrency)

    def check_row(self, row: dict[str, Any]) -> None:
        """A row's tests parse (the dataset environment asks at config time); ValueError otherwise."""
        self.tests_of(row)

    def tests_of(self, row: dict[str, Any]) -> list[TestCase]:
        column = self.options.tests_column or next((c for c in TEST_COLUMNS if c in row), None)
        if column is None or column not in row:
            raise ValueError(f"the row has no tests column (looked for {self.options.tests_column or TEST_COLUMNS}"
                             f"; columns: {', '.join(row)})")
        cases = parse_tests(row[column], self.options.fn_name or row_fn_name(row))
        if not cases:
            raise ValueError(f"column {column!r} holds no test cases")
        return cases

    async def __call__(self, completion: str, answer: str = "", **row: Any) -> Reward:
        cases = self.tests_of(row)
        code = extract_code(completion, self.options.language, self.options.fenced_only)
        if code is None:
            return Reward(0.0, {**dict.fromkeys(OUTCOMES, 0.0), "no_code": 1.0})
        counts = dict.fromkeys(OUTCOMES, 0)
        stop_at_failure = self.options.mode == "all"
        runs = self.sandbox.run(code, [c.job for c in cases])
        try:
            index = 0
            async for result in runs:
                counts[outcome(cases[index], result)] += 1
                index += 1
                if stop_at_failure and counts["passed"] < index:
                    break
        finally:
            await runs.aclose()
        n = len(cases)
        total = counts["passed"] / n if self.options.mode == "fraction" else float(counts["passed"] == n)
        return Reward(total, {**{k: v / n for k, v in counts.items()}, "no_code": 0.0})


def code_tests_reward(options: dict[str, Any], env_id: str) -> CodeTests:
    return CodeTests(CodeTestsOptions.parse(options, env_id))
