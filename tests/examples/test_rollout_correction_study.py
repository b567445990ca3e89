"""examples/rollout_correction_study: its configs resolve (and differ only in [loss]), and analyze.py's table."""

import importlib.util
import json
import math
import tomllib

import pytest

from prime_rl.configs.cli import build_config
from prime_rl.configs.toml_io import write_toml
from prime_rl.launch.rl_config import RLConfig
from prime_rl.trainer.config import TrainerConfig
from tests.support import REPO

STUDY = REPO / "examples" / "rollout_correction_study"
_spec = importlib.util.spec_from_file_location("rollout_correction_study_analyze", STUDY / "analyze.py")
analyze = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(analyze)

NAMES = list(analyze.RUNS)


def resolve(name, k, tmp_path):
    """The config `run.sh` runs: `rl @ <name>.toml --max-async-level k --output-dir ...`."""
    return build_config(RLConfig, ["@", str(STUDY / f"{name}.toml"), "--max-async-level", str(k),
                                   "--output-dir", str(tmp_path / f"async{k}" / name)])[0]


def test_the_study_has_a_toml_per_objective_and_run_sh_runs_them_all():
    assert sorted(p.stem for p in STUDY.glob("*.toml")) == sorted([*NAMES, "base"])
    script = (STUDY / "run.sh").read_text()
    assert "for name in " + " ".join(NAMES) + "; do" in script
    assert "for k in " + " ".join(map(str, analyze.ASYNC_LEVELS)) + "; do" in script


@pytest.mark.parametrize("k", analyze.ASYNC_LEVELS)
@pytest.mark.parametrize("name", NAMES)
def test_every_config_resolves(name, k, tmp_path):
    config = resolve(name, k, tmp_path)
    assert config.max_async_level == k
    assert config.output_dir == tmp_path / f"async{k}" / name
    trainer = config.derived().trainer
    assert trainer.update_epochs == 2
    assert trainer.loss == config.loss  # handed to the trainer as resolved
    # The trainer reads its config back from the TOML rl writes (configs/trainer.toml): the loss must survive.
    write_toml(tmp_path / "trainer.toml", trainer.model_dump(mode="json"))
    reread = build_config(TrainerConfig, ["@", str(tmp_path / "trainer.toml")])[0]
    assert reread.loss == config.loss


def flatten(d, prefix=""):
    out = {}
    for key, value in d.items():
        out |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out


def test_the_objectives_differ_only_in_loss_and_output_dir(tmp_path):
    for name in NAMES:  # each file: its include, its output_dir and its [loss], nothing else
        raw = tomllib.loads((STUDY / f"{name}.toml").read_text())
        assert set(raw) == {"include", "output_dir", "loss"}, name
        assert raw["output_dir"] == f"outputs/rollout_correction_study/async2/{name}"
    for k in analyze.ASYNC_LEVELS:
        dumps = {name: flatten(resolve(name, k, tmp_path).model_dump(mode="json")) for name in NAMES}
        # `loss` and `output_dir` are handed down to the components (trainer.loss, orchestrator.output_dir, ...)
        rest = {name: {key: v for key, v in d.items() if not ({"loss", "output_dir"} & set(key.split(".")))}
                for name, d in dumps.items()}
        assert all(r == rest["default"] for r in rest.values())
        losses = {json.dumps({key: v for key, v in d.items() if key.startswith("loss.")}, sort_keys=True)
                  for d in dumps.values()}
        assert len(losses) == len(NAMES)


def test_each_objective_is_the_one_the_readme_names(tmp_path):
    loss = {name: resolve(name, 2, tmp_path).loss for name in NAMES}
    assert loss["default"].type == "default" and not loss["default"].correction.active
    assert loss["dppo"].type == "dppo" and not loss["dppo"].correction.active
    assert loss["grpo"].type == "grpo" and not loss["grpo"].correction.active
    for name in ("tis", "icepop", "geo_rs", "decoupled_ppo"):
        assert loss[name].type == "grpo" and loss[name].correction.old_logprobs == "trainer", name
    tis, icepop, geo, dppo = (loss[n].correction for n in ("tis", "icepop", "geo_rs", "decoupled_ppo"))
    assert (tis.weight, tis.weight_cap, tis.weight_bounds, tis.reject) == ("token", 2.0, None, [])
    assert (icepop.weight, icepop.weight_bounds, icepop.reject) == ("token", (0.5, 5.0), [])
    assert geo.weight == "none" and len(geo.reject) == 1
    assert geo.reject[0].rule == "seq_mean_k1"
    assert (geo.reject[0].low, geo.reject[0].high) == pytest.approx((1 / 1.001, 1 / 0.999))
    assert (dppo.weight, dppo.weight_cap, dppo.weight_floor, dppo.weight_bounds, dppo.reject) == (
        "token", math.inf, 0.0, None, [])


def write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summarize_on_a_synthetic_run(tmp_path):
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # steps 0..6: last 5 = 0.3..0.7, mean 0.5
    records = []
    for step, reward in enumerate(rewards):
        records.append({"step": step, "source": "orchestrator", "time": 1.0, "reward/mean": reward,
                        "async/policy_lag_mean": min(step, 2) * 1.0, "async/policy_lag_max": min(step, 2) * 1.0})
        trainer = {"step": step, "source": "trainer", "time": 1.0, "loss/mismatch_kl": 0.01 * step}
        if step >= 3:  # a metric logged on some steps only: averaged over those
            trainer["correction/rejected_frac"] = 0.25 * (step - 3)  # 0, .25, .5, .75
        records.append(trainer)
    records.append({"step": 7, "source": "trainer", "time": 1.0, "note": "a string is not a metric"})
    write_metrics(tmp_path / "metrics.jsonl", records)

    row = analyze.summarize(analyze.read_run(tmp_path / "metrics.jsonl"))
    assert row["steps"] == list(range(7)) and row["reward"] == rewards
    assert row["reward_0"] == 0.1
    assert row["reward_last"] == pytest.approx(0.5)
    assert row["gain"] == pytest.approx(0.4)
    assert row["mismatch_kl"] == pytest.approx(0.03)  # mean of 0, .01, ..., .06
    assert row["rejected_frac"] == pytest.approx(0.375)
    assert row["policy_lag"] == pytest.approx((0 + 1 + 2 * 5) / 7)
    assert row["policy_lag_max"] == 2.0
    for key in ("correction_kl", "is_weight", "truncated_frac"):  # never logged
        assert math.isnan(row[key])

    (tmp_path / "async2" / "tis").mkdir(parents=True)  # read_run also takes a run directory
    write_metrics(tmp_path / "async2" / "tis" / "metrics.jsonl", records)
    assert analyze.read_run(tmp_path / "async2" / "tis").get("orchestrator", "reward/mean")[6] == 0.7

    table = analyze.summary_table({2: {"tis": row}})
    assert ("| 2 | `tis` | grpo + decoupled_token_is (TIS, C = 2) | 0.100 | 0.500 | +0.400 | 0.03 | - | - | - "
            "| 37.5% | 1.57 (2) |") in table
    steps = analyze.step_table({2: {"tis": row}}, every=5)
    assert steps.splitlines()[2:] == ["| 0 | 0.100 |", "| 5 | 0.600 |", "| 6 | 0.700 |"]
