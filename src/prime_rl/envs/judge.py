"""The `judge` reward: a judge model scores the completion under a rubric, through any OpenAI-compatible chat API.

    rewards = { judge = 1.0 }
    reward_options.judge = { base_url = "http://127.0.0.1:8001/v1", model = "judge",     # or none: rl's [judge]
                             template = "Question: {prompt}\\nReference: {answer}\\nAnswer: {completion}\\n...",
                             score_range = [0, 10] }

The template is filled from the example: `{completion}` (the completion's answer part), `{prompt}` (the text of the
prompt's last user message), `{answer}` (the reference) and every column of the row by name; a field the rows lack
is one line at config time. The judge's reply (its answer after a `<think>` block, `chat.reasoning`) is read as

- a number (default): the last number in the reply ("8/10" reads 8), which must lie in `score_range` [lo, hi];
  the reward is (x - lo) / (hi - lo), in [0, 1];
- or a label (`labels = {correct = 1.0, incorrect = 0.0}`): the last of the labels that appears in the reply
  as a whole word (case-insensitive); the reward is its value.

A reply with no number, a number out of range, no label, an unreachable, failing or slow judge (`timeout_s` per
attempt, `retries` more attempts, 1 s apart) raise `JudgeFailed`: the rollout fails under the environment's
`on_error`, with one log line. At most `max_concurrency` requests are in flight (requests from concurrent rollouts
are batched by the judge's server). The key is read from the environment variable `api_key_var` (never written in
the TOML). Components: `score` (the raw number, or the label's value).
"""

from __future__ import annotations

import asyncio
import os
import re
import string
from dataclasses import dataclass, field
from typing import Any

import httpx

from prime_rl.chat.reasoning import split_reasoning
from prime_rl.envs.environment import Reward
from prime_rl.envs.rewards import typed_options
from prime_rl.utils.errors import UserError
from prime_rl.utils.loop_limit import LoopLimit

_SCORE = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)(?:\s*/\s*\d+(?:\.\d+)?)?")


def last_score(text: str) -> float | None:
    """The last number in `text`, a trailing "/ N" read as "out of N" ("8/10" is 8), or None."""
    found = _SCORE.findall(text)
    return float(found[-1]) if found else None


RL_JUDGE_ENV = {"base_url": "PRIME_JUDGE_BASE_URL", "model": "PRIME_JUDGE_MODEL", "key": "PRIME_JUDGE_API_KEY"}
"""Where the orchestrator finds the judge `rl` serves (a `[judge]` section): a judge reward without base_url uses it."""


class JudgeFailed(RuntimeError):
    """The judge gave no usable score: the rollout fails under `on_error`."""


@dataclass(frozen=True)
class JudgeOptions:
    base_url: str = ""
    model: str = ""
    template: str = ""
    system_prompt: str = ""
    score_range: list = field(default_factory=lambda: [0.0, 10.0])
    labels: dict = field(default_factory=dict)
    api_key_var: str = ""
    max_tokens: int = 512
    temperature: float = 0.0
    timeout_s: float = 60.0
    retries: int = 2
    max_concurrency: int = 8

    @classmethod
    def parse(cls, options: dict[str, Any], env_id: str) -> JudgeOptions:
        def fail(message: str) -> UserError:
            return UserError(f"environment '{env_id}': judge {message}")

        parsed = typed_options(cls, options, fail)
        if parsed.base_url and not parsed.base_url.startswith(("http://", "https://")):
            raise fail(f"base_url must be the judge's OpenAI API root (e.g. \"http://127.0.0.1:8001/v1\"), got "
                       f"{parsed.base_url!r}")
        if (parsed.base_url and not parsed.model) or not parsed.template:
            raise fail("needs model (the judge server's model name; not with the judge rl serves) and template (the "
                       "rubric prompt)")
        lo, hi = (parsed.score_range + [None, None])[:2] if isinstance(parsed.score_range, list) else (None, None)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (lo, hi)) or not lo < hi:
            raise fail(f"score_range must be [lo, hi] with lo < hi, got {parsed.score_range!r}")
        if any(not isinstance(v, int | float) or isinstance(v, bool) for v in parsed.labels.values()):
            raise fail(f"labels must map words to numbers, got {parsed.labels!r}")
        if parsed.retries < 0 or parsed.timeout_s <= 0 or parsed.max_concurrency < 1:
            raise fail("needs retries >= 0, timeout_s > 0 and max_concurrency >= 1")
        if parsed.api_key_var and parsed.api_key_var not in os.environ:
            raise fail(f"api_key_var names {parsed.api_key_var}, which is not set")
        template_fields(parsed.template, env_id)
        return parsed


def template_fields(template: str, env_id: str = "judge") -> list[str]:
    """The `{field}` names of a rubric template; a malformed template is a one-line UserError."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError as exc:
        raise UserError(f"environment '{env_id}': judge template: {exc} (write literal braces as {{{{ }}}})") from None


def read_score(reply: str, options: JudgeOptions) -> float:
    """The reply's score (module docstring) in [0, 1] for a number, or the label's value; JudgeFailed otherwise."""
    text = split_reasoning(reply).answer
    if options.labels:
        found = [(m.start(), label) for label in options.labels
                 for m in re.finditer(rf"(?<!\w){re.escape(label)}(?!\w)", text, re.IGNORECASE)]
        if not found:
            raise JudgeFailed(f"the judge's reply names none of the labels {', '.join(options.labels)}: "
                              f"{text[-120:]!r}")
        return float(options.labels[max(found)[1]])
    value = last_score(text)
    lo, hi = options.score_range
    if value is None:
        raise JudgeFailed(f"the judge's reply holds no number: {text[-120:]!r}")
    if not lo <= value <= hi:
        raise JudgeFailed(f"the judge's score {value:g} is outside [{lo:g}, {hi:g}]")
    return (value - lo) / (hi - lo)


class Judge:
    """The `judge` reward function: `await Judge(options)(completion, answer, **row) -> Reward`."""

    __name__ = "judge"

    def __init__(self, options: JudgeOptions, transport: httpx.AsyncBaseTransport | None = None):
        self.options = options
        self.fields = template_fields(options.template)
        self._limit = LoopLimit(options.max_concurrency)
        self._transport = transport
        self._key = os.environ.get(options.api_key_var, "") if options.api_key_var else ""

    def _server(self) -> tuple[str, str, str]:
        """(URL, model, key): the options', or the judge rl serves (RL_JUDGE_ENV) when they name no base_url."""
        if self.options.base_url:
            return self.options.base_url, self.options.model, self._key
        url = os.environ.get(RL_JUDGE_ENV["base_url"])
        if not url:
            raise JudgeFailed("the judge reward has no base_url and no judge server was started for it "
                              "(rl starts one for a [judge] section)")
        return (url, self.options.model or os.environ.get(RL_JUDGE_ENV["model"], ""),
                self._key or os.environ.get(RL_JUDGE_ENV["key"], ""))

    def check_row(self, row: dict[str, Any]) -> None:
        missing = [f for f in self.fields if f not in ("completion", "prompt", "answer") and f not in row]
        if missing:
            raise ValueError(f"the judge template asks for {', '.join(missing)}, which the row lacks "
                             f"(columns: {', '.join(map(str, row))})")

    def prompt(self, completion: str, answer: str, row: dict[str, Any]) -> list[dict[str, str]]:
        values = {**{k: v for k, v in row.items() if k in self.fields}, "completion": completion, "answer": answer,
                  "prompt": _last_user_text(row)}
        text = self.options.template.format(**values)
        system = [{"role": "system", "content": self.options.system_prompt}] if self.options.system_prompt else []
        return [*system, {"role": "user", "content": text}]

    async def __call__(self, completion: str, answer: str = "", **row: Any) -> Reward:
        reply = await self._ask(self.prompt(completion, answer, row))
        score = read_score(reply, self.options)
        raw = last_score(split_reasoning(reply).answer) if not self.options.labels else score
        return Reward(score, {"score": float(raw if raw is not None else score)})

    async def _ask(self, messages: list[dict[str, str]]) -> str:
        base_url, model, key = self._server()
        body = {"model": model, "messages": messages, "max_tokens": self.options.max_tokens,
                "temperature": self.options.temperature}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = base_url.rstrip("/") + "/chat/completions"
        why = ""
        async with self._limit(), httpx.AsyncClient(transport=self._transport,
                                                      timeout=self.options.timeout_s) as client:
            for attempt in range(self.options.retries + 1):
                if attempt:
                    await asyncio.sleep(1.0)
                try:
                    response = await client.post(url, json=body, headers=headers)
                    if response.status_code >= 500 or response.status_code == 429:
                        why = f"HTTP {response.status_code}"
                        continue
                    response.raise_for_status()
                    return str(response.json()["choices"][0]["message"]["content"] or "")
                except httpx.TimeoutException:
                    why = f"no answer within {self.options.timeout_s:g} s"
                except httpx.HTTPStatusError as exc:
                    raise JudgeFailed(f"the judge at {url} refused the request: HTTP {exc.response.status_code} "
                                      f"{exc.response.text[:200]}") from None
                except httpx.HTTPError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                except (ValueError, KeyError, IndexError, TypeError):
                    raise JudgeFailed(f"the judge at {url} answered something that is not a chat completion") from None
        raise JudgeFailed(f"the judge at {url} failed {self.options.retries + 1} time(s): {why}")


def _last_user_text(row: dict[str, Any]) -> str:
    prompt = next((row[c] for c in ("prompt", "question", "messages") if c in row), "")
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def judge_reward(options: dict[str, Any], env_id: str) -> Judge:
    return Judge(JudgeOptions.parse(options, env_id))
