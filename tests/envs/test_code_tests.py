"""The `code_tests` reward: every test format scores a correct solution 1, a wrong one 0 and a partial one its
fraction; program extraction, output matching, and the dataset environment reading code data as it comes."""

from __future__ import annotations

import asyncio
import json

import pytest

from prime_rl.envs.code_tests import CodeTests, CodeTestsOptions, extract_code, outputs_match, parse_tests, values_match
from prime_rl.envs.dataset import DatasetEnv
from prime_rl.envs.environment import Example
from prime_rl.utils.errors import UserError


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```\n"


def score(row: dict, code: str, **options) -> tuple[float, dict]:
    reward = CodeTests(CodeTestsOptions.parse({"sandbox": "auto", "timeout_s": 3.0, **options}, "test"))
    result = asyncio.run(reward(fenced(code), "", **row))
    return result.total, result.components


APPS_STDIO = {"input_output": json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7\n"]})}
ADD = "a, b = map(int, input().split())\nprint(a + b)"
APPS_CALL = {"input_output": json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4], [10, -3]],
                                         "outputs": [[3], [7], [7]]})}
LCB_STDIN = {"public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
                                              {"input": "3 4", "output": "7", "testtype": "stdin"}])}
LCB_FUNCTIONAL = {"public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"},
                                                   {"input": "3\n4", "output": "7", "testtype": "functional"}]),
                  "metadata": json.dumps({"func_name": "add"})}
MBPP = {"test_list": ["assert add(1, 2) == 3", "assert add(3, 4) == 7", "assert add(10, -3) == 7"]}
ASSERT_CODE = {"test": "assert add(1, 2) == 3\nassert add(3, 4) == 7"}


@pytest.mark.parametrize("row, right, wrong, partial, fraction", [
    (APPS_STDIO, ADD, "print(0)", "a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)", 2 / 3),
    (APPS_CALL, "def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b",
     "def add(a, b):\n    return a + b if a < 5 else 0", 2 / 3),
    (LCB_STDIN, ADD, "print(5)", "a, b = map(int, input().split())\nprint(3)", 1 / 2),
    (LCB_FUNCTIONAL, "class Solution:\n    def add(self, a, b):\n        return a + b",
     "def add(a, b):\n    return 0", "def add(a, b):\n    return 3", 1 / 2),
    (MBPP, "def add(a, b):\n    return a + b", "def add(a, b):\n    return None",
     "def add(a, b):\n    return 3 if a == 1 else 0", 1 / 3),
    (ASSERT_CODE, "def add(a, b):\n    return a + b", "def add(a, b):\n    return 1", None, None),
], ids=["apps-stdio", "apps-call", "lcb-stdin", "lcb-functional", "mbpp-asserts", "assert-code"])
def test_every_format_scores_right_wrong_and_partial_solutions(row, right, wrong, partial, fraction):
    assert score(row, right)[0] == 1.0
    total, parts = score(row, wrong)
    assert total == 0.0 and parts["passed"] == 0.0 and parts["wrong_answer"] == 1.0
    if partial is not None:
        assert score(row, partial)[0] == pytest.approx(fraction)
        assert score(row, partial, mode="all")[0] == 0.0


@pytest.mark.slow
def test_components_count_each_kind_of_failure():
    row = {"tests": json.dumps({"inputs": ["1\n", "2\n", "3\n", "4\n", "5\n"],
                                "outputs": ["1\n", "2\n", "3\n", "4\n", "5\n"]})}
    code = ("n = int(input())\nif n == 2: print(7)\nif n == 3: raise ValueError\nif n == 4:\n    while True: pass\n"
            "if n == 5: print('x' * 10**6)\nif n == 1: print(1)")
    total, parts = score(row, code, timeout_s=1.0, output_kib=64)
    assert total == pytest.approx(0.2)
    assert {k: parts[k] for k in ("passed", "wrong_answer", "runtime_error", "timeout", "output_limit")} == {
        "passed": 0.2, "wrong_answer": 0.2, "runtime_error": 0.2, "timeout": 0.2, "output_limit": 0.2}
    assert score(row, "print(")[1]["compile_error"] == 1.0


@pytest.mark.slow
def test_mode_all_stops_at_the_first_failure():
    row = {"tests": json.dumps({"inputs": ["1\n"] * 4, "outputs": ["2\n"] * 4})}
    total, parts = score(row, "import time\ntime.sleep(2)\nprint(1)", mode="all", timeout_s=1.0)
    assert total == 0.0 and parts["timeout"] == 0.25  # the other three cases never ran


def test_a_completion_without_a_program_scores_zero_as_no_code():
    reward = CodeTests(CodeTestsOptions.parse({"timeout_s": 3.0}, "test"))
    result = asyncio.run(reward("I cannot solve this.", "", **APPS_STDIO))
    assert result.total == 0.0 and result.components["no_code"] == 1.0
    loose = CodeTests(CodeTestsOptions.parse({"fenced_only": False, "timeout_s": 3.0}, "test"))
    assert asyncio.run(loose(ADD, "", **APPS_STDIO)).total == 1.0


def test_the_last_block_in_the_language_is_the_program():
    text = "```python\nprint(1)\n```\n```bash\nls\n```\n```py\nprint(2)\n```\n```js\nx\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("no code") is None and extract_code("print(4)", fenced_only=False) == "print(4)"
    assert extract_code("```python\nprint(5)\n", fenced_only=False) is None  # an unclosed fence is no program


def test_outputs_match_ignores_trailing_space_and_compares_numbers_closely():
    assert outputs_match("1 2  \n3\n\n\n", "1 2\n3")
    assert outputs_match("0.3333333", "0.33333333") and not outputs_match("0.34", "0.33")
    assert not outputs_match("1 2", "1 2 3") and not outputs_match("a", "b")
    assert values_match([1, [2.0000000001, "x"]], [1, [2, "x"]]) and not values_match(True, 1)
    assert not values_match({"a": 1}, {"a": 1, "b": 2})


def test_unknown_formats_and_options_are_one_line_errors():
    with pytest.raises(ValueError, match="as many 'inputs' as 'outputs'"):
        parse_tests({"inputs": [1, 2], "outputs": [1]})
    with pytest.raises(ValueError, match="unknown test format"):
        parse_tests(42)
    with pytest.raises(ValueError, match="needs the function's name"):
        parse_tests([{"input": "1", "output": "1", "testtype": "functional"}])
    with pytest.raises(UserError, match="code_tests has no option.*modee.*allowed: timeout_s, memory_mib"):
        CodeTestsOptions.parse({"modee": "all"}, "e")
    with pytest.raises(UserError, match="mode must be one of fraction, all"):
        CodeTestsOptions.parse({"mode": "most"}, "e")
    with pytest.raises(UserError, match="language must be one of python"):
        CodeTestsOptions.parse({"language": "rust"}, "e")
    with pytest.raises(UserError, match="needs url"):
        CodeTestsOptions.parse({"sandbox": "sandbox_fusion"}, "e")
    with pytest.raises(UserError, match="timeout_s must be a number"):
        CodeTestsOptions.parse({"timeout_s": "5"}, "e")
    with pytest.raises(UserError, match="sandbox limit memory_mib must be a positive number"):
        CodeTestsOptions.parse({"memory_mib": 0}, "e")


def test_the_dataset_environment_reads_code_data_as_it_comes(tmp_path):
    rows = [{"question": "Add two numbers", "input_output": APPS_STDIO["input_output"], "difficulty": "easy"},
            {"question": "Add again", "input_output": APPS_CALL["input_output"]}]
    path = tmp_path / "apps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = DatasetEnv(path=str(path), answer_column="", rewards={"code_tests": 1.0},
                     reward_options={"code_tests": {"timeout_s": 3.0}})
    example = env.train[0]
    assert example.answer == "" and example.prompt[-1]["content"] == "Add two numbers"
    reward = asyncio.run(env.score(example, fenced(ADD)))
    assert reward.total == 1.0 and reward.components["code_tests"] == 1.0
    assert reward.components["code_tests/passed"] == 1.0 and reward.components["code_tests/no_code"] == 0.0


def test_rows_whose_tests_do_not_parse_fail_at_config_time(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "p", "tests": json.dumps({"inputs": [1], "outputs": []})}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: reward 'code_tests': tests need as many"):
        DatasetEnv(path=str(path), answer_column="", rewards={"code_tests": 1.0})
    with pytest.raises(UserError, match="reward_options for judge, which is not a configured reward in rewards"):
        DatasetEnv(path=str(path), answer_column="", rewards={"exact_match": 1.0}, reward_options={"judge": {}})


def test_an_example_without_its_tests_column_fails_the_rollout():
    reward = CodeTests(CodeTestsOptions.parse({"tests_column": "tests"}, "e"))
    with pytest.raises(ValueError, match="no tests column"):
        asyncio.run(reward(fenced("print(1)"), "", **{"input_output": "{}"}))
    assert Example  # the row is the example's info (the dataset environment passes it)
