"""The environment protocol: a dataset of examples, the environment's side of a conversation,
and async reward functions.

An environment has an `id` and yields `Example`s (chat prompt messages, the reference
answer, free-form info) from `examples(seed)` (an infinite, deterministic iterator). One with a
finite set of training examples may also give them as a pool with ids (`example_pool()`), which
an online curriculum samples by difficulty.

A rollout is a conversation. The example's prompt opens it; the policy answers; the
environment answers back with `await respond(example, messages, state) -> EnvReply`
(user or tool messages, or done), up to `max_turns` policy turns; then the whole
conversation is scored with `await score_rollout(example, rollout) -> Reward`.
A single-turn environment is the one-turn case: `respond` is done at once, and it only
implements `score(example, completion_text)` (the last assistant message's text), which
the default `score_rollout` calls. A multi-turn environment subclasses
`MultiTurnEnvironment` and implements `respond` and `score_rollout`.

`score_group(example, rollouts)` may score the `n` rollouts of one prompt together (e.g.
rank them) and return their rewards; the default (None) scores each rollout alone.
`Reward.total` is the scalar the advantages are computed from (in [0, 1] for the
built-ins); `Reward.components` are named parts logged as `reward/<env>/<name>`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prime_rl.utils.errors import UserError


@dataclass(frozen=True)
class Example:
    """One prompt: chat messages ({"role", "content"} dicts), the reference answer, extra info."""

    prompt: list[dict[str, str]]
    answer: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reward:
    """A completion's score: `total` trains, `components` are logged."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


@dataclass
class Rollout:
    """One finished conversation as the environment scores it: the `messages` after the example's prompt
    (assistant turns with the policy's text, the environment's user/tool replies), whether the last turn was
    cut (by max_tokens or the context: `truncated`), and the environment's per-rollout `state`."""

    messages: list[dict[str, Any]]
    truncated: bool = False
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def completion(self) -> str:
        """The text of the last assistant turn ("" when there is none)."""
        answers = [m for m in self.messages if m.get("role") == "assistant"]
        return str(answers[-1].get("content") or "") if answers else ""

    @property
    def turns(self) -> int:
        """Policy turns (assistant messages)."""
        return sum(m.get("role") == "assistant" for m in self.messages)


TOOL_ERROR_KINDS = ("bad_json", "unknown_tool", "bad_arguments", "exception", "timeout")
"""The kinds of failed tool calls an `EnvReply` reports (`rollout/tool_errors/<kind>`)."""


@dataclass(frozen=True)
class EnvReply:
    """The environment's answer to a policy turn: messages to append (`user` or `tool` roles), or `done`.
    A tool environment also says how many tool calls the turn made and the kind of each failed one
    (`bad_json`, `unknown_tool`, `bad_arguments`, `exception`, `timeout`): logged as rollout metrics."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    tool_calls: int = 0
    tool_errors: tuple[str, ...] = ()


class Environment(ABC):
    """What the orchestrator samples prompts from and scores rollouts with."""

    id: str
    multi_turn: bool = False
    """False: one policy turn per rollout, generated through the chat endpoint (the server templates the prompt).
    True: the orchestrator runs the conversation token-in, token-out (`respond` after every turn)."""
    max_turns: int = 1
    """Most policy turns of a rollout (`[[orchestrator.env]] max_turns` overrides it)."""
    tools: list[dict[str, Any]] = []
    """OpenAI-style tool schemas handed to the chat template (`tools=`); none by default."""

    @property
    def rollout_kind(self) -> str:
        """How the orchestrator runs this environment's rollouts: "single_turn" or "multi_turn" (by `multi_turn`);
        "agent" for an agent environment; a kind of your own names a runner you registered
        (`orchestrator/rollouts/kinds.py`)."""
        return "multi_turn" if self.multi_turn else "single_turn"

    @abstractmethod
    def examples(self, seed: int = 0) -> Iterator[Example]:
        """An infinite iterator of examples; the same seed gives the same sequence."""

    def eval_examples(self, seed: int = 0) -> Iterator[Example]:
        """The examples `[orchestrator.eval]` draws (held-out ones where the environment has them); by default
        `examples` of the seed the orchestrator gives it (another stream than training's)."""
        return self.examples(seed)

    def example_pool(self) -> Sequence[Example] | None:
        """The training examples as a finite pool with ids, `pool[i]` being example `i` (the `dataset` environment:
        its rows), which `[orchestrator.curriculum]` samples by each example's recent pass rate; None (the
        default): the environment has no example ids (it generates an endless stream), and a curriculum over it is
        a config error. Return the same list, of the same objects, on every call."""
        return None

    async def score(self, example: Example, completion: str) -> Reward:
        """Score one completion text (special tokens already removed) of `example` (single-turn environments)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither score nor score_rollout")

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        """The ideal conversation after the prompt, which `sft` trains on (`data.env`): by default the reference
        answer as one assistant message; a multi-turn environment returns its turns and replies."""
        return [{"role": "assistant", "content": example.answer}]

    def initial_state(self, example: Example) -> dict[str, Any]:
        """The per-rollout state `respond` and `score_rollout` see (a fresh dict per rollout)."""
        return {}

    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        """The environment's reply to the conversation so far (`messages`: after the prompt, ending with the
        policy's turn). Single-turn: done at once."""
        return EnvReply(done=True)

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        """Score one finished conversation; by default `score` of its last assistant text."""
        return await self.score(example, rollout.completion)

    async def score_group(self, example: Example, rollouts: list[Rollout]) -> list[Reward] | None:
        """Rewards of all rollouts of one prompt at once (one per rollout, in order), or None to score each
        rollout alone with `score_rollout` (the default)."""
        return None


class MultiTurnEnvironment(Environment):
    """An environment that answers the policy: implement `respond` and `score_rollout`."""

    multi_turn = True
    max_turns = 4

    @abstractmethod
    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        """Messages that answer the policy's last turn, or EnvReply(done=True) to end the rollout."""

    @abstractmethod
    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        """Score the whole conversation."""


class SyntheticEnvironment(Environment):
    """An environment whose examples are generated from a seeded `random.Random`.

    Subclasses implement `make_example(rng)`; `examples(seed)` calls it forever with one
    RNG seeded by `seed`, so the n-th example of a seed never changes (resume skips ahead).
    """

    @abstractmethod
    def make_example(self, rng: random.Random) -> Example:
        """Draw one example."""

    def examples(self, seed: int = 0) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.make_example(rng)


def chat_prompt(system_prompt: str, user: str) -> list[dict[str, str]]:
    """A user message, after a system message when `system_prompt` is not empty."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": user}]


def require(condition: bool, env_id: str, message: str) -> None:
    """Argument check for environment constructors: a one-line UserError naming the env."""
    if not condition:
        raise UserError(f"environment '{env_id}': {message}")
