"""Agent rollouts: the gateway served on loopback, one session per rollout, the agent run under its limits.

`AgentRunner` serves the run's `AgentGateway` (`agents/gateway.py`) on 127.0.0.1 (a free port, in the
orchestrator's own event loop, from the first agent rollout until the orchestrator stops). An agent function's
`openai` client runs in this process too: its HTTP client hands requests to the gateway's app directly (the same
app, the same answers, no socket), which roughly halves the orchestrator's CPU on a 256-session step against
loopback HTTP; commands, and any other client a function builds from the session's URL, use the socket.

For a draw of an `agent` environment (`envs/agent.py`) and `n` rollouts it opens `n` sessions, each sampling under
the run's rule with the rollout's seed, runs the environment's agent program once per session (at most its
`max_concurrency` at once, each within its `timeout_s`), and closes the session when the agent returns, fails or
times out: a call still generating then is dropped, and the session's key is refused from then on.

What a rollout trains is its session's segments (`agents/stitching.py`): each one a sample with its own prompt, every
one with the rollout's reward and advantage; with the environment's `turn_discount` gamma < 1, the tokens of call j
of the rollout's J calls get gamma^(J - 1 - j) of the advantage (the last call all of it; `discounted`). What the
environment scores (when the agent returned no reward) is the recorded conversation: the messages of the session's
last call after the example's prompt, then the reply it got. A rollout fails (reward 0, under the environment's
`on_error`) when its agent raised, exited non-zero, printed no reward, outlasted its limit, or never called the
model; it then trains nothing (its 0 still counts in its group's baseline): a failure may be the machine's (a slow
server, a timeout), not the policy's, and an agent that wants the policy to learn from one returns 0 instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import uvicorn

from prime_rl.envs.agent import AGENT_REWARD, AgentEnvironment
from prime_rl.envs.environment import Example, Reward, Rollout
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.agents.gateway import AgentGateway, Session
from prime_rl.orchestrator.rollouts.env_calls import EnvironmentFailed, report_failure
from prime_rl.orchestrator.rollouts.scored_group import Group, TrainedPiece, TurnStats
from prime_rl.orchestrator.rollouts.scoring import cut_unsampleable, score_group
from prime_rl.orchestrator.rollouts.seam import RolloutSettings, RunnerContext


def discounted(segments: list[RolloutCompletion], discount: float) -> list[list[float] | None]:
    """Per segment, each token's factor gamma^(J - 1 - j) for a token of call j of the rollout's J calls (in
    order: a session's calls fill its segments one after the other), 1 on the tokens between calls (not
    trained); all None when gamma = 1."""
    if discount == 1.0:
        return [None] * len(segments)
    call, calls_of = -1, []  # per segment, per token: the call that sampled it (None: between calls)
    for completion in segments:
        row = []
        for k, keep in enumerate(completion.mask):
            call += keep and (k == 0 or not completion.mask[k - 1])
            row.append(call if keep else None)
        calls_of.append(row)
    return [[1.0 if j is None else discount ** (call - j) for j in row] for row in calls_of]


@dataclass
class AgentGroup:
    """The `n` agent rollouts of one draw: per rollout its segments as samples, the conversation to score, how it
    went and why it failed (None: it did not); `result` summarises each rollout by its last segment."""

    result: ChatResult
    pieces: list[list[TrainedPiece]]
    rollouts: list[Rollout]
    stats: list[TurnStats]
    failed: list[str | None]


class _LoopServer(uvicorn.Server):
    """uvicorn inside the orchestrator's loop: the orchestrator, not the gateway, owns the process's signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def conversation_after_prompt(example: Example, session: Session) -> list[dict]:
    """The messages the environment scores: the last call's messages after the example's prompt (all of them when
    the agent sent another opening), then its reply."""
    if not session.stitcher.segments:
        return []
    messages = session.stitcher.segments[-1].messages
    prompt = [{"role": m["role"], "content": m["content"]} for m in example.prompt]
    opening = [{"role": m.get("role"), "content": m.get("content")} for m in messages[:len(prompt)]]
    return [dict(m) for m in messages[len(prompt) if opening == prompt else 0:]]


def session_stats(session: Session) -> TurnStats:
    """How a session went: calls as turns, sampled and template tokens, the tool calls the policy made, the
    reasoning it wrote, its segments and forks by reason."""
    segments = session.stitcher.segments
    sampled = sum(sum(s.record.mask) for s in segments)
    return TurnStats(turns=session.calls, sampled_tokens=sampled,
                     env_tokens=sum(len(s.record.mask) for s in segments) - sampled,
                     tool_calls=sum(len(m.get("tool_calls") or ()) for m in session.replies),
                     reasoning_chars=sum(len(m.get("reasoning_content") or "") for m in session.replies),
                     segments=len(segments), forks=collections.Counter(session.stitcher.forks))


class AgentRunner:
    """The runner of kind "agent": serves the gateway and runs agent rollouts (module docstring)."""

    def __init__(self, gateway: AgentGateway):
        self.gateway = gateway
        self._server: _LoopServer | None = None
        self._serving: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None  # the agent functions' connections to the gateway
        self._starting = asyncio.Lock()
        self._limits: dict[str, asyncio.Semaphore] = {}

    @classmethod
    def build(cls, context: RunnerContext) -> AgentRunner:
        config = context.config
        return cls(AgentGateway(context.client, context.chat_tokens, config.seq_len, config.model.name,
                                config.reasoning))

    async def start(self) -> None:
        """Serve the gateway on a free loopback port (once; later calls return at once)."""
        async with self._starting:
            if self._serving is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            self.gateway.root_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            config = uvicorn.Config(self.gateway.app, log_level="warning", lifespan="off",
                                    timeout_graceful_shutdown=1)
            self._server = _LoopServer(config)
            self._serving = asyncio.create_task(self._server.serve(sockets=[sock]))
            while not self._server.started:
                if self._serving.done():
                    self._serving.result()  # raises why it did not start
                    raise RuntimeError("the agent gateway stopped before it started")
                await asyncio.sleep(0.01)
            # Agent functions run in this process: their client calls the gateway's app directly (no socket, no
            # HTTP parsing, no connection pool, whose per-request scan of every connection dominated the CPU of
            # 256 concurrent sessions); what they read is what the served app answers.
            self._http = httpx.AsyncClient(transport=httpx.ASGITransport(self.gateway.app, raise_app_exceptions=False),
                                           timeout=httpx.Timeout(None))

    async def stop(self) -> None:
        """Stop serving (every open session's calls fail from then on)."""
        if self._serving is None:
            return
        await self._http.aclose()
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._serving
        self._serving = self._server = self._http = None

    async def run_group(self, draw: Draw, n: int, rule: SamplingRule, settings: RolloutSettings,
                        seed: int | None) -> Group:
        """`n` agent rollouts of `draw`, scored, each training its segments (an id past the tokenizer's cuts its
        rollout: `cut_unsampleable`)."""
        out = await self._sessions(draw, n, rule, settings.max_tokens, seed)
        failed = cut_unsampleable(draw, [[p.completion for p in rollout] for rollout in out.pieces],
                                  settings.vocab, out.failed)
        pieces = [[p if p.scales is None else p._replace(scales=p.scales[:len(p.completion.token_ids)])
                   for p in rollout] for rollout in out.pieces]  # a cut completion's discount as long as it
        group = await score_group(draw, out.result, settings.truncated_reward, out.rollouts, out.stats, failed)
        return replace(group, pieces=pieces)

    async def _sessions(self, draw: Draw, n: int, rule: SamplingRule, max_tokens: int, seed: int | None
                        ) -> AgentGroup:
        """`n` agent rollouts of `draw` (module docstring)."""
        await self.start()
        env = draw.environment
        assert isinstance(env, AgentEnvironment)
        limit = self._limits.setdefault(draw.env, asyncio.Semaphore(env.max_concurrency))

        async def one(index: int) -> tuple[Session, Reward | None, str | None]:
            async with limit:
                session = self.gateway.open_session(rule, max_tokens, None if seed is None else seed + index)
                reward = None
                try:
                    reward = await asyncio.wait_for(
                        env.program.run(session.base_url, session.key, draw.example, self._http), env.timeout_s)
                    why = None if session.calls else "the agent never called the model"
                except TimeoutError:
                    why = f"the agent took longer than timeout_s = {env.timeout_s:g}s"
                except EnvironmentFailed:
                    raise
                except Exception as exc:  # an agent's bug fails its rollout only (FunctionAgent: sys.exit too)
                    why = f"the agent failed: {type(exc).__name__}: {str(exc)[:300]}"
                finally:
                    self.gateway.close_session(session.id)
            return session, reward, (None if why is None else report_failure(draw, why))

        done = await asyncio.gather(*(one(i) for i in range(n)))
        return self._group(draw, done)

    @staticmethod
    def _group(draw: Draw, done: list[tuple[Session, Reward | None, str | None]]) -> AgentGroup:
        """The group of the finished sessions (module docstring)."""
        discount = draw.environment.turn_discount
        pieces = []
        for session, _, why in done:
            segments = session.stitcher.segments if why is None else []  # a failed rollout trains nothing
            completions = [s.record for s in segments]
            pieces.append([TrainedPiece(s.prompt_ids, c, scales) for s, c, scales
                           in zip(segments, completions, discounted(completions, discount), strict=True)])
        steps = [step for rollout in pieces for piece in rollout for step in piece.completion.weight_steps]
        last = [rollout[-1].completion if rollout else RolloutCompletion([], [], "", "stop") for rollout in pieces]
        prompt = next((rollout[0].prompt_ids for rollout in pieces if rollout), [])
        rollouts = []
        for (session, reward, _), completion in zip(done, last, strict=True):
            state = {AGENT_REWARD: reward} if reward is not None else {}
            rollouts.append(Rollout(conversation_after_prompt(draw.example, session), completion.truncated, state))
        return AgentGroup(ChatResult(prompt, min(steps, default=0), last), pieces, rollouts,
                          [session_stats(session) for session, _, _ in done], [why for _, _, why in done])
