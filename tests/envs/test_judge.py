"""The `judge` reward: the rubric filled from the row, the score read as a number in a range or a label, and every
way a judge can fail (no number, out of range, down, slow, refusing) fails the rollout with a one-line reason."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from prime_rl.envs.dataset import DatasetEnv
from prime_rl.envs.judge import Judge, JudgeFailed, JudgeOptions, last_score, read_score
from prime_rl.utils.errors import UserError

TEMPLATE = "Question: {prompt}\nReference: {answer}\nTopic: {topic}\nAnswer: {completion}\nScore 0-10."


class Judged:
    """A chat-completions endpoint answering `replies` in turn (a reply may be an exception or a status code)."""

    def __init__(self, *replies):
        self.replies, self.requests = list(replies), []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "no"}})
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": reply}}]})


def judge(handler, **options) -> Judge:
    parsed = JudgeOptions.parse({"base_url": "http://judge.test/v1", "model": "j", "template": TEMPLATE,
                                 "retries": 1, **options}, "e")
    return Judge(parsed, transport=httpx.MockTransport(handler))


def call(j: Judge, completion="42", **row):
    return asyncio.run(j(completion, "42", **{"prompt": "What is 6 x 7?", "topic": "math", **row}))


def test_the_rubric_is_filled_from_the_row_and_the_score_scaled_to_one():
    handler = Judged("<think>maybe 3</think>The answer is right. Score: 8/10")
    reward = call(judge(handler, system_prompt="You grade."))
    assert reward.total == pytest.approx(0.8) and reward.components == {"score": 8.0}
    sent = handler.requests[0]
    assert sent["model"] == "j" and sent["temperature"] == 0.0
    assert sent["messages"][0] == {"role": "system", "content": "You grade."}
    assert sent["messages"][1]["content"] == ("Question: What is 6 x 7?\nReference: 42\nTopic: math\nAnswer: 42\n"
                                              "Score 0-10.")


def test_labels_map_the_last_label_named_to_its_value():
    j = judge(Judged("Not INCORRECT at all: it is Correct."), labels={"correct": 1.0, "incorrect": 0.0})
    assert call(j).total == 1.0
    assert call(judge(Judged("incorrect"), labels={"correct": 1.0, "incorrect": 0.0})).total == 0.0


@pytest.mark.parametrize("reply, why", [("I like it.", "holds no number"), ("Score: 11", "outside \\[0, 10\\]"),
                                        ("Score: -1", "outside")])
def test_a_reply_without_a_usable_score_fails_the_rollout(reply, why):
    with pytest.raises(JudgeFailed, match=why):
        call(judge(Judged(reply)))
    with pytest.raises(JudgeFailed, match="names none of the labels"):
        call(judge(Judged("maybe"), labels={"yes": 1.0, "no": 0.0}))


@pytest.mark.slow
def test_a_judge_that_is_down_slow_or_failing_fails_the_rollout_after_its_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    down = Judge(JudgeOptions.parse({"base_url": f"http://127.0.0.1:{port}/v1", "model": "j", "template": TEMPLATE,
                                     "retries": 0}, "e"))
    with pytest.raises(JudgeFailed, match="failed 1 time\\(s\\): ConnectError"):
        call(down)
    slow = Judged(httpx.ReadTimeout("slow"))
    with pytest.raises(JudgeFailed, match="failed 2 time\\(s\\): no answer within 60 s"):
        call(judge(slow))
    assert len(slow.requests) == 2
    with pytest.raises(JudgeFailed, match="refused the request: HTTP 400"):
        call(judge(Judged(400)))
    flaky = Judged(503, "Score: 5")
    assert call(judge(flaky)).total == 0.5 and len(flaky.requests) == 2
    with pytest.raises(JudgeFailed, match="not a chat completion"):
        call(judge(lambda request: httpx.Response(200, json={"nope": 1})))


def test_a_rubric_field_the_data_lacks_is_one_line_at_config_time(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n")
    options = {"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "j", "template": TEMPLATE}}
    with pytest.raises(UserError, match=r"rows.jsonl:1: reward 'judge': the judge template asks for topic, which "
                                        r"the row lacks \(columns: prompt, answer\)"):
        DatasetEnv(path=str(path), rewards={"judge": 1.0}, reward_options=options)


@pytest.mark.parametrize("options, why", [
    ({"base_url": "x"}, "base_url must be"), ({"base_url": "http://x/v1"}, "needs model .* and template"),
    ({"base_url": "http://x/v1", "model": "m", "template": "{oops"}, "judge template: "),
    ({"base_url": "http://x/v1", "model": "m", "template": "t", "score_range": [5, 1]}, "score_range must be"),
    ({"base_url": "http://x/v1", "model": "m", "template": "t", "api_key_var": "NO_SUCH_VAR_HERE"}, "is not set"),
    ({"base_url": "http://x/v1", "model": "m", "template": "t", "rubric": "x"}, "has no option"),
])
def test_bad_options_are_one_line_errors(options, why):
    with pytest.raises(UserError, match=why):
        JudgeOptions.parse(options, "e")


def test_the_key_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "k-123")
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"choices": [{"message": {"content": "7"}}]})
    assert call(judge(handler, api_key_var="MY_JUDGE_KEY")).total == pytest.approx(0.7)
    assert seen == ["Bearer k-123"]


def test_scores_read_out_of_n_and_ignore_versions():
    assert last_score("Rating: 7 / 10.") == 7.0 and last_score("v1.2 scored 9") == 9.0 and last_score("none") is None
    options = JudgeOptions.parse({"base_url": "http://x/v1", "model": "m", "template": "t", "score_range": [1, 5]},
                                 "e")
    assert read_score("<think>5</think> 3", options) == 0.5


def test_a_judge_that_thinks_is_read_after_its_reasoning_only():
    # The judge's reply splits as a completion does (chat.reasoning): a block its template opened and the reply
    # closed, or one it never closed (the budget ran out while thinking: no score, whatever numbers it mused on).
    options = JudgeOptions.parse({"base_url": "http://x/v1", "model": "m", "template": "t", "score_range": [1, 5]},
                                 "e")
    assert read_score("maybe 2, maybe 4</think>\nScore: 3", options) == 0.5
    with pytest.raises(JudgeFailed, match="holds no number"):  # the 4 is a thought, not the answer
        read_score("maybe 2, maybe 4</think>\nLooks right.", options)
    with pytest.raises(JudgeFailed, match="holds no number"):
        read_score("<think>it deserves a 4, or a 5", options)
