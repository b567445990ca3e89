"""The online curriculum: examples weighed by their recent pass rate (the pool math), a data set whose half is
always solved drawn as the config says, a resume that draws exactly what an uninterrupted run draws, and the
one-line refusals of a curriculum over environments without example ids."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from prime_rl.envs import Example, load_env
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.collector import Collected
from prime_rl.orchestrator.config import CurriculumConfig, EnvConfig, OrchestratorConfig
from prime_rl.orchestrator.examples.curriculum import Curriculum, example_pools
from prime_rl.orchestrator.examples.draws import ExampleSource
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState, load_state
from prime_rl.utils.errors import UserError
from tests.support.entrypoints import run_entrypoint


def write_rows(path, n: int) -> str:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(n)))
    return str(path)


def pool_of(n: int) -> list[Example]:
    return [Example([{"role": "user", "content": f"q{i}"}], f"a{i}") for i in range(n)]


@dataclass
class Scored:
    """A scored group as `Curriculum.observe` reads it."""

    env: str
    example: Example
    rewards: list[float]
    errors: list[str | None] = field(default_factory=list)


def curriculum(n: int = 6, **settings) -> tuple[Curriculum, list[Example]]:
    examples = pool_of(n)
    return Curriculum(CurriculumConfig(**settings), {"data": examples}, {"data": 1.0}, seed=3), examples


def frequencies(cur: Curriculum, draws: int) -> Counter:
    return Counter(int(cur.draw("data").answer[1:]) for _ in range(draws))


def test_the_pool_math_weighs_each_example_by_its_pass_rate():
    """Guards the weights: easy (rate >= easy_rate), hard (<= hard_rate), in between (1) and unseen, and the draw
    probabilities w_i / sum w that `curriculum/easy_prob` reports."""
    cur, ex = curriculum(easy_weight=0.25, hard_weight=0.5, unseen_weight=2.0, pass_threshold=0.9)
    cur.observe([Scored("data", ex[0], [1.0, 0.95, 1.0, 0.9]),  # easy: every reward >= pass_threshold
                 Scored("data", ex[1], [0.0, 0.5, 0.89, 0.0]),  # hard: none passes
                 Scored("data", ex[2], [1.0, 0.0, 1.0, 0.0]),  # in between
                 Scored("other", ex[3], [1.0, 1.0])])  # another environment's group: ignored
    assert [cur.level(cur.pools["data"].history.get(i)) for i in range(6)] == [
        "easy", "hard", "normal", "unseen", "unseen", "unseen"]
    weights = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert cur.pools["data"].weights == weights
    metrics = cur.metrics()
    total = sum(weights)
    assert metrics == pytest.approx({"curriculum/pool_size": 6.0, "curriculum/easy_frac": 1 / 6,
                                     "curriculum/hard_frac": 1 / 6, "curriculum/unseen_frac": 0.5,
                                     "curriculum/easy_prob": 0.25 / total, "curriculum/hard_prob": 0.5 / total})
    counts = frequencies(cur, 40_000)
    for i, weight in enumerate(weights):
        assert counts[i] / 40_000 == pytest.approx(weight / total, abs=0.01)


def test_the_rate_is_over_the_last_window_groups_and_failed_rollouts_do_not_count():
    cur, ex = curriculum(window=2)
    cur.observe([Scored("data", ex[0], [1.0, 1.0])])
    assert cur.level(cur.pools["data"].history[0]) == "easy"
    cur.observe([Scored("data", ex[0], [0.0, 0.0])])  # (2 + 0) / 4
    assert cur.level(cur.pools["data"].history[0]) == "normal"
    cur.observe([Scored("data", ex[0], [0.0, 0.0])])  # the first group left the window: 0 / 4
    assert cur.level(cur.pools["data"].history[0]) == "hard"
    # a failed rollout (the environment raised: scored 0) is left out; a group of only failures records nothing
    cur.observe([Scored("data", ex[1], [1.0, 0.0], ["score raised", None]),
                 Scored("data", ex[1], [1.0, 0.0], [None, "score raised"])])
    assert list(cur.pools["data"].history[1]) == [(0, 1), (1, 1)]
    cur.observe([Scored("data", ex[2], [0.0, 0.0], ["timeout", "timeout"])])
    assert 2 not in cur.pools["data"].history


def test_window_1_takes_the_latest_group_alone():
    cur, ex = curriculum(window=1)
    for rewards, level in (([1.0, 1.0], "easy"), ([0.0, 0.0], "hard"), ([1.0, 0.0], "normal")):
        cur.observe([Scored("data", ex[0], rewards)])
        assert cur.level(cur.pools["data"].history[0]) == level


@pytest.mark.parametrize("easy_weight", [0.2, 0.0])
def test_every_example_solved_draws_uniformly_and_never_divides_by_zero(easy_weight, caplog):
    """Guards the end of a curriculum: every example easy, with weights equal (0.2) or all 0, still draws (uniform
    over the pool), and the metrics stay finite."""
    cur, ex = curriculum(n=4, easy_weight=easy_weight)
    cur.observe([Scored("data", e, [1.0, 1.0]) for e in ex])
    counts = frequencies(cur, 8_000)
    assert sorted(counts) == [0, 1, 2, 3] and all(c / 8_000 == pytest.approx(0.25, abs=0.02) for c in counts.values())
    metrics = cur.metrics()
    assert metrics["curriculum/easy_frac"] == 1.0 and metrics["curriculum/easy_prob"] == pytest.approx(1.0)
    assert ("every example of environment 'data' weighs 0" in caplog.text) == (easy_weight == 0)


def test_a_weight_of_0_is_never_drawn_while_another_weighs_more():
    cur, ex = curriculum(n=4, hard_weight=0.0, unseen_weight=0.0)
    cur.observe([Scored("data", ex[0], [0.0, 0.0]), Scored("data", ex[1], [1.0, 0.0])])
    assert set(frequencies(cur, 2_000)) == {1}  # ex[0] is hard, ex[2] and ex[3] unseen: all weigh 0


def test_unseen_examples_weigh_unseen_weight():
    """An example never seen keeps unseen_weight; 0 leaves the pool to the seen ones, except before any is seen
    (every weight 0: uniform)."""
    cur, ex = curriculum(n=4, unseen_weight=0.0)
    assert set(frequencies(cur, 400)) == {0, 1, 2, 3}
    cur.observe([Scored("data", ex[3], [1.0, 0.0])])
    assert set(frequencies(cur, 400)) == {3}
    cur, ex = curriculum(n=3, unseen_weight=3.0)
    cur.observe([Scored("data", ex[0], [1.0, 0.0])])
    assert frequencies(cur, 20_000)[0] / 20_000 == pytest.approx(1 / 7, abs=0.01)


def test_a_pool_needs_ids_and_distinct_examples(tmp_path):
    with pytest.raises(UserError, match="^curriculum: environment 'reverse-text' has no example ids"):
        example_pools({"reverse-text": load_env("reverse-text")}, CurriculumConfig())
    same = pool_of(1) * 2
    with pytest.raises(UserError, match="same Example object at two ids"):
        Curriculum(CurriculumConfig(), {"data": same}, {"data": 1.0}, seed=0)


def test_only_the_named_environments_draw_by_the_curriculum(tmp_path):
    """Guards a mix: a data set under the curriculum beside a generated environment, which draws its own stream
    exactly as without a curriculum."""
    configs = [EnvConfig(id="dataset", args={"path": write_rows(tmp_path / "d.jsonl", 8)}),
               EnvConfig(id="reverse-text")]
    plain = ExampleSource(configs, seed=5)
    mixed = ExampleSource(configs, seed=5, curriculum=CurriculumConfig(envs=["dataset"]))
    assert mixed.curriculum.applies_to("dataset") and not mixed.curriculum.applies_to("reverse-text")
    plain_draws, mixed_draws = plain.draw(60), mixed.draw(60)
    assert [d.env for d in plain_draws] == [d.env for d in mixed_draws]  # the environments' RNG is untouched
    assert ([d.example for d in plain_draws if d.env == "reverse-text"]
            == [d.example for d in mixed_draws if d.env == "reverse-text"])
    pool = mixed.envs["dataset"].example_pool()
    assert all(any(d.example is e for e in pool) for d in mixed_draws if d.env == "dataset")


# --- through the orchestrator: a data set whose half is always solved ------------------------------------------


class HalfSolved:
    """A policy that solves every even row (every completion right: pass rate 1) and half of the completions of
    every odd one (pass rate 0.5); with `vary`, the request seed also makes some groups all right or all wrong, so
    an example's window moves between the pools."""

    def __init__(self, vary: bool = False):
        self.vary = vary

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        row = int(messages[-1]["content"][1:])
        right = [row % 2 == 0 or j % 2 == 0 for j in range(n)]
        if self.vary and seed % 3 == 0:
            right = [True] * n
        elif self.vary and seed % 3 == 1:
            right = [False] * n
        completions = []
        for ok in right:
            text = f"a{row}" if ok else "x"
            ids = [ord(c) % 90 for c in text] + [2]  # ids of the character tokenizer
            completions.append(RolloutCompletion(ids, [-0.5] * len(ids), text, "stop"))
        return ChatResult([1] * 5, 0, completions)

    async def update_weights(self, path, step):
        raise AssertionError("max_async_level covers every step: no weight update")


def orchestrator_config(tmp_path, data: str, **overrides) -> OrchestratorConfig:
    return OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 64, "rollouts_per_example": 2, "seq_len": 64,
        "max_async_level": 1000, "wandb": {"mode": "disabled"}, "seed": 7,
        "env": [{"id": "dataset", "args": {"path": data}}], **overrides})


def generate(orch: Orchestrator, steps: range) -> list:
    return [asyncio.run(orch.generate(step)) for step in steps]


def solved_share(generated) -> float:
    rows = [int(g.example.answer[1:]) for step in generated for g in step.groups]
    return sum(row % 2 == 0 for row in rows) / len(rows)


def test_the_solved_half_of_a_data_set_is_drawn_as_the_pool_says(tmp_path):
    """The acceptance case: 20 rows, the even ones always solved. Without a curriculum they are half the draws;
    with easy_weight 0.2 their share falls to 10 * 0.2 / (10 * 0.2 + 10) = 1/6 once every row was seen, and
    `curriculum/easy_prob` says so."""
    data = write_rows(tmp_path / "d.jsonl", 20)
    plain = Orchestrator(orchestrator_config(tmp_path / "plain", data), HalfSolved(), OrchestratorState())
    assert solved_share(generate(plain, range(4))) == 0.5  # 4 epochs of the rows
    config = orchestrator_config(tmp_path / "curriculum", data, curriculum={"easy_weight": 0.2})
    orch = Orchestrator(config, HalfSolved(), OrchestratorState())
    generated = generate(orch, range(20))
    assert solved_share(generated[:1]) == pytest.approx(0.5, abs=0.2)  # step 0: every row unseen, uniform
    seen = next(i for i, g in enumerate(generated) if g.metrics["curriculum/unseen_frac"] == 0)
    assert seen <= 4
    for g in generated[seen:]:
        assert g.metrics["curriculum/easy_frac"] == 0.5 and g.metrics["curriculum/hard_frac"] == 0
        assert g.metrics["curriculum/easy_prob"] == pytest.approx(1 / 6) and g.metrics["curriculum/pool_size"] == 20
    assert solved_share(generated[seen + 1:]) == pytest.approx(1 / 6, abs=0.045)  # ~480 draws: 2.7 sd


def test_a_resume_draws_exactly_what_an_uninterrupted_run_draws(tmp_path):
    """Guards the curriculum's checkpoint: its RNG and windows go through the real save_state/load_state JSON, and
    the resumed orchestrator's draws and state equal the uninterrupted run's at every later step."""
    data = write_rows(tmp_path / "d.jsonl", 12)
    settings = {"window": 2, "easy_weight": 0.1, "hard_weight": 0.3, "unseen_weight": 2.0}

    def draws(generated):
        return [[g.example.answer for g in step.groups] for step in generated]

    straight = Orchestrator(orchestrator_config(tmp_path / "a", data, curriculum=settings), HalfSolved(vary=True),
                            OrchestratorState())
    expected = generate(straight, range(10))
    levels = {level for g in expected[4:] for level in ("easy", "hard")
              if 0 < g.metrics[f"curriculum/{level}_frac"] < 1}
    assert levels == {"easy", "hard"}  # the windows move: the resumed run has something to reproduce

    config = orchestrator_config(tmp_path / "b", data, curriculum=settings)
    first = Orchestrator(config, HalfSolved(vary=True), OrchestratorState())
    head = generate(first, range(4))
    first.checkpoint(head[-1].state)
    state = load_state(config.output_dir, 4)
    assert state == head[-1].state and state.curriculum["envs"]["dataset"]["history"]
    resumed = Orchestrator(config, HalfSolved(vary=True), state)
    tail = generate(resumed, range(4, 10))
    assert draws(head + tail) == draws(expected)
    assert [g.state.to_json() for g in head + tail] == [g.state.to_json() for g in expected]


@pytest.mark.slow
def test_continuous_rollouts_feed_the_curriculum_too(tmp_path):
    """Continuous mode draws ahead (its in-flight draws are skipped on resume, so it is not exact), but the groups
    each step collects still update the windows."""
    data = write_rows(tmp_path / "d.jsonl", 20)
    config = orchestrator_config(tmp_path, data, rollout_mode="continuous", curriculum={})
    orch = Orchestrator(config, HalfSolved(), OrchestratorState())

    async def steps():
        try:
            return [await orch.generate(step) for step in range(4)]
        finally:
            await orch.close()

    generated = asyncio.run(steps())
    assert generated[-1].metrics["curriculum/unseen_frac"] < 1 and generated[-1].state.curriculum["envs"]["dataset"]
    assert generated[-1].metrics["curriculum/easy_frac"] > 0


def test_an_old_checkpoint_without_a_curriculum_starts_it_unseen(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 6)
    config = orchestrator_config(tmp_path, data, curriculum={})
    old = OrchestratorState(step=3, env_cursors={"dataset": 96})
    orch = Orchestrator(config, HalfSolved(), OrchestratorState.from_json(old.to_json()))
    assert orch.source.curriculum.metrics()["curriculum/unseen_frac"] == 1.0


def test_a_checkpoint_of_another_pool_size_is_one_line(tmp_path):
    cur, ex = curriculum(n=6)
    cur.observe([Scored("data", ex[0], [1.0])])
    with pytest.raises(UserError, match="had 6 examples, its pool now has 5: the example ids changed"):
        Curriculum(CurriculumConfig(), {"data": pool_of(5)}, {"data": 1.0}, seed=3, state=cur.state())
    # a smaller window keeps each example's latest groups
    cur, ex = curriculum(n=2, window=3)
    cur.observe([Scored("data", ex[0], r) for r in ([1.0], [0.0], [1.0])])
    again = Curriculum(CurriculumConfig(window=1), {"data": ex}, {"data": 1.0}, seed=3, state=cur.state())
    assert list(again.pools["data"].history[0]) == [(1, 1)]
    assert again.rng.random() == cur.rng.random()


# --- config: one line, exit code 2 -------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "prefix"), [("orchestrator", ""), ("rl", "orchestrator.")])
def test_a_curriculum_over_an_environment_without_ids_is_one_line_exit_2(command, prefix):
    result = run_entrypoint(command, f"--{prefix}curriculum", "{}", "--dry-run")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "curriculum: environment 'reverse-text' has no example ids" in result.stderr
    assert "name the environments that have them in curriculum.envs" in result.stderr


@pytest.mark.parametrize(("overrides", "message"), [
    ({"env": [{"id": "reverse-text"}], "curriculum": {"envs": ["reverse-text"]}},
     "environment 'reverse-text' has no example ids .*: leave it out of curriculum.envs"),
    ({"curriculum": {"envs": ["dataset"]}}, "curriculum.envs names no environment 'dataset'"),
    ({"curriculum": {"envs": []}}, "curriculum.envs"),
    ({"curriculum": {"hard_rate": 0.6, "easy_rate": 0.6}}, "hard_rate = 0.6 must be below easy_rate = 0.6"),
    ({"curriculum": {"easy_weight": -1}}, "curriculum.easy_weight"),
    ({"curriculum": {"window": 0}}, "curriculum.window"),
])
def test_bad_curriculum_settings_are_config_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        OrchestratorConfig.build(overrides=overrides)


def test_a_curriculum_over_a_data_set_beside_a_generated_environment_is_fine(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 4)
    envs = [{"id": "dataset", "args": {"path": data}, "name": "rows"}, {"id": "reverse-text"}]
    config = OrchestratorConfig.build(overrides={"env": envs, "curriculum": {"envs": ["rows"]}})
    assert config.curriculum.envs == ["rows"]
    with pytest.raises(ValueError, match="environment 'reverse-text' has no example ids"):
        OrchestratorConfig.build(overrides={"env": envs, "curriculum": {}})
    agent = {"id": "agent", "args": {"task": {"id": "dataset", "args": {"path": data}},
                                     "command": ["true"]}}
    assert OrchestratorConfig.build(overrides={"env": [agent], "curriculum": {}}).curriculum is not None


def test_the_draws_use_their_own_rng_not_the_global_one():
    cur, _ = curriculum()
    random.seed(1)
    first = [cur.draw("data").answer for _ in range(20)]
    cur, _ = curriculum()
    random.seed(2)
    assert [cur.draw("data").answer for _ in range(20)] == first


def test_groups_dropped_as_stale_still_count_in_the_pass_rates(tmp_path):
    """A continuous step's groups that finished too late for its batch are scored all the same: the curriculum counts
    them (an example whose groups always go stale would otherwise stay unseen forever)."""
    data = write_rows(tmp_path / "d.jsonl", 4)
    orch = Orchestrator(orchestrator_config(tmp_path, data, curriculum={}), HalfSolved(), OrchestratorState())
    draws = orch.source.draw(2)
    groups = asyncio.run(orch.collector.parts.generator.generate(draws, [1, 2]))

    class Collector:
        async def prepare(self, step, evaluating):
            pass

        async def collect(self, step):
            return Collected([], [], {}, stale=groups)

    orch.collector = Collector()
    generated = asyncio.run(orch.generate(0))
    assert generated.metrics["curriculum/unseen_frac"] == pytest.approx(1 - len({d.example.answer for d in draws}) / 4)
