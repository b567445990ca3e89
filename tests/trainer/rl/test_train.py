"""The RL trainer end to end on synthetic rollout batches (in-process: one-rank gloo group)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prime_rl.models.lora_adapter import ADAPTER_WEIGHTS
from prime_rl.run_dir import RUN_LOCK, resolve_resume_step, weights_dir
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.rl.train import main, train
from prime_rl.trainer.trainer_ckpt import ckpt_dir
from prime_rl.utils.errors import NonFiniteError, UserError
from prime_rl.utils.fs import WaitTimeout, list_steps
from tests.support import REPO
from tests.support.synthetic_batches import random_step, write_random_step

VOCAB = 99  # the char tokenizer of tiny_model_dir


def config(model_dir: Path, out: Path, **overrides) -> TrainerConfig:
    base = {
        "model": {"name": str(model_dir)},
        "output_dir": str(out),
        "max_steps": 2,
        "seq_len": 64,
        "wandb": {"mode": "disabled"},
        "runtime": {"deterministic": True},
        "batch_timeout_s": 30.0,
    }
    for key, value in overrides.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and key in base else value
    return TrainerConfig.build([], base)


def write_steps(out: Path, steps, world_size: int = 1, micro_batches: int = 2, advantage: dict | None = None,
                **kwargs) -> None:
    """Random batches of `steps`; for a token-level `advantage` type, with rewards and that type recorded."""
    kind = (advantage or {}).get("type")
    for step in steps:
        write_random_step(out, step, world_size, random_step(VOCAB, step, micro_batches, rewards=kind is not None,
                                                             **kwargs), advantage=kind)


def metrics_lines(out: Path, source: str = "trainer") -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["source"] == source]


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    """The tensors of weights/step_N: full weights, or a LoRA adapter's."""
    path = weights_dir(out, step)
    return load_file(path / "model.safetensors" if (path / "model.safetensors").exists() else path / ADAPTER_WEIGHTS)


def test_two_steps_write_weights_metrics_checkpoints_and_log(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    write_steps(out, range(2))
    train(config(tiny_model_dir, out, ckpt={"interval": 1}))

    assert list_steps(out / "weights") == [1, 2]
    assert weights(out, 1).keys() == weights(out, 2).keys()
    assert not all(torch.equal(weights(out, 1)[k], weights(out, 2)[k]) for k in weights(out, 1))
    for step in (1, 2):
        names = {p.name for p in ckpt_dir(out, step).iterdir()}
        assert {"meta.json", "rank_0.json", "manifest.json", ".metadata", "__0_0.distcp"} == names
    lines = metrics_lines(out)
    assert [m["step"] for m in lines] == [0, 1]
    required = {"loss/importance_ratio", "loss/soft_gate_weight", "loss/entropy", "loss/total", "optim/lr",
                "optim/grad_norm", "perf/tokens_per_s", "perf/step_time_s", "perf/peak_memory_gib",
                "async/wait_for_batch_s"}
    for m in lines:
        assert required <= m.keys(), required - m.keys()
        assert all(math.isfinite(m[k]) for k in required)
    assert "trainer" in (out / "logs" / "trainer.log").read_text()
    assert (out / "configs" / "trainer.toml").exists()


GAE = {"type": "gae", "gamma": 0.95, "lam": 0.9}
HEAD = {"type": "value_head", "value_coef": 0.5, "optim": {"lr": 1e-2}}
LORA = {"rank": 4, "dropout": 0.1, "modules_to_save": ["norm"]}


@pytest.mark.parametrize("lora, advantage, critic", [
    (None, None, None),
    (LORA, None, None),
    (None, GAE, None),
    (None, GAE, HEAD),
    (LORA, GAE, HEAD),
], ids=["full", "lora", "gae_critic", "gae_value_head", "lora_value_head"])
@pytest.mark.slow
def test_missing_batch_times_out_then_resume_is_identical(tiny_model_dir, tmp_path, lora, advantage, critic):
    """3 steps straight == 2 steps, crash (batch 2 missing), resume from the checkpoint, 1 step; bit for bit,
    also for LoRA (whose checkpoint holds only the adapters, the saved norms and their optimizer state) and
    with a critic (GAE: step 2's advantages come from the resumed critic, which then trains too): a separate
    one, or a value head on the policy (also with LoRA, whose adapters then learn from the value loss too)."""
    sched = {"scheduler": {"type": "linear", "warmup_steps": 1}, "max_steps": 3, "lora": lora,
             **({"advantage": advantage} if advantage else {}), **({"critic": critic} if critic else {})}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    write_steps(straight, range(3), advantage=advantage)
    train(config(tiny_model_dir, straight, **sched))

    write_steps(resumed, range(2), advantage=advantage)
    with pytest.raises(WaitTimeout, match="rollout batch of step 2"):
        train(config(tiny_model_dir, resumed, ckpt={"interval": 1}, batch_timeout_s=0.5, **sched))
    assert list_steps(resumed / "weights") == [1, 2]
    write_steps(resumed, [2], advantage=advantage)
    train(config(tiny_model_dir, resumed, ckpt={"resume_step": "latest"}, **sched))

    a, b = weights(straight, 3), weights(resumed, 3)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0, msg=key)
    if lora is not None:  # the frozen base is not in the checkpoint: only what trains and its optimizer state
        from torch.distributed.checkpoint import FileSystemReader

        stored = FileSystemReader(str(ckpt_dir(resumed, 2))).read_metadata().state_dict_metadata
        model_keys = [key for key in stored if key.startswith("model.")]
        assert all(".lora_" in key or key.endswith("norm.weight") for key in model_keys), model_keys
        assert any(".lora_" in key for key in model_keys) and "model.model.norm.weight" in model_keys, model_keys
        assert "base_model.model.model.norm.weight" in a  # the trained norm ships with the adapter
    steps = [m["step"] for m in metrics_lines(resumed)]
    assert steps == [0, 1, 2]  # step numbers continue after the resume
    lr_straight = [m["optim/lr"] for m in metrics_lines(straight)]
    assert [m["optim/lr"] for m in metrics_lines(resumed)] == lr_straight
    if advantage is not None:  # the critic resumed exactly: the same values, the same value loss
        last_straight, last_resumed = metrics_lines(straight)[-1], metrics_lines(resumed)[-1]
        for key in ("value/mean", "value/explained_variance", "value/loss", "value/grad_norm"):
            assert last_straight[key] == last_resumed[key], key
    if critic is not None:  # the head trained (its values moved) and stays out of the weights the servers get
        assert len({m["value/mean"] for m in metrics_lines(straight)}) == 3
        if lora is None:
            assert set(a) == set(load_file(tiny_model_dir / "model.safetensors")), sorted(a)


@pytest.mark.slow
def test_a_critic_checkpoint_resumes_only_with_a_critic_and_the_advantage_types_must_agree(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    write_steps(out, range(1))
    train(config(tiny_model_dir, out, ckpt={"interval": 1}, max_steps=1))  # no critic
    write_steps(out, [1])
    with pytest.raises(UserError, match="trained with no critic but this run has a separate critic") as caught:
        train(config(tiny_model_dir, out, ckpt={"resume_step": 1}, max_steps=2, advantage={"type": "gae"}))
    assert "\n" not in str(caught.value)
    # A trainer started by hand with another type than the orchestrator's: refused, never zero advantages.
    for theirs, ours, words in [("gae", "grpo", "of type 'gae' but the trainer runs 'grpo'"),
                                ("reinforce_plus_plus", "gae", "of type 'reinforce_plus_plus' but the trainer runs"),
                                ("grpo", "gae", "of type 'grpo' but the trainer runs 'gae'"),
                                (None, "gae", "of an unrecorded type but the trainer runs 'gae'")]:
        fresh = tmp_path / f"fresh_{theirs}_{ours}"
        micro_batches = random_step(VOCAB, 0, 2, rewards=theirs in ("gae", "reinforce_plus_plus"))
        write_random_step(fresh, 0, 1, micro_batches, advantage=theirs)
        with pytest.raises(UserError, match=words):
            train(config(tiny_model_dir, fresh, max_steps=1, advantage={"type": ours}))
    fresh = tmp_path / "no_rewards"
    write_random_step(fresh, 0, 1, random_step(VOCAB, 0, 2), advantage="gae")
    with pytest.raises(UserError, match="advantage type 'gae' needs the batch's rewards"):
        train(config(tiny_model_dir, fresh, max_steps=1, advantage={"type": "gae"}))


@pytest.mark.slow
def test_non_finite_loss_stops_before_writing(tiny_model_dir, tmp_path):
    out = tmp_path / "nan"
    write_steps(out, range(2))
    batch = torch.load(out / "rollouts" / "step_1" / "rank_0.pt", weights_only=True)
    batch["micro_batches"][0]["advantages"][:] = float("nan")
    torch.save(batch, out / "rollouts" / "step_1" / "rank_0.pt")
    with pytest.raises(NonFiniteError, match="step 1: non-finite loss"):
        train(config(tiny_model_dir, out, ckpt={"interval": 1}))
    assert list_steps(out / "weights") == [1]
    assert list_steps(out / "checkpoints") == [1]


def test_non_finite_parameters_after_the_optimizer_step_stop_before_writing(tiny_model_dir, tmp_path, monkeypatch):
    """Regression: a damaged optimizer moment (-2.4e8 after a flipped byte) turned finite
    gradients into NaN weights that were published; the loss and gradient-norm guard cannot see it."""
    out = tmp_path / "run"
    write_steps(out, range(3))
    original, calls = torch.optim.AdamW.step, []

    def damaged_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # optimizer step of step 1
            self.state[self.param_groups[0]["params"][0]]["exp_avg_sq"].fill_(-2.4e8)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", damaged_step)
    with pytest.raises(NonFiniteError, match=r"^trainer step 1: \d+ parameter\(s\) non-finite after the optimizer "
                                             r"step \(first: model\.embed_tokens\.weight\); stopping before"):
        train(config(tiny_model_dir, out, max_steps=3, ckpt={"interval": 1}))
    assert list_steps(out / "weights") == [1]
    assert list_steps(out / "checkpoints") == [1]


def files_state(out: Path) -> dict[str, tuple[int, int]]:
    """Size and time of every run file (not the logs, nor the run lock a hand-started trainer takes)."""
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*")
            if p.is_file() and p.parts[len(out.parts)] != "logs" and p.name != RUN_LOCK}


def test_flipped_bytes_in_a_checkpoint_shard_stop_the_resume_in_one_line(tiny_model_dir, tmp_path, capsys):
    """Regression: 8 flipped bytes in a .distcp shard loaded silently and the next step wrote
    NaN weights. Now the resume exits 2 with one line naming the file, and writes nothing."""
    out = tmp_path / "run"
    write_steps(out, range(3))
    train(config(tiny_model_dir, out, ckpt={"interval": 1}))
    shard = ckpt_dir(out, 1) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    shard.write_bytes(bytes(data))
    before = files_state(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["--model.name", str(tiny_model_dir), "--output-dir", str(out), "--wandb.mode", "disabled",
              "--max-steps", "3", "--ckpt.resume-step", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"checkpoint file {shard} is corrupted (sha256 mismatch)" in err
    assert "Traceback" not in err
    assert files_state(out) == before


def test_entrypoint_exit_codes(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "codes"
    with pytest.raises(SystemExit) as exc:
        main(["--num-processes", "0", "--output-dir", str(out)])
    assert exc.value.code == 2
    assert "num_processes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a missing model is the user's problem: exit 2, one line
        main(["--model.name", str(tmp_path / "nope"), "--output-dir", str(out), "--wandb.mode", "disabled"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:  # a missing batch is a runtime failure: exit 1
        main(["--model.name", str(tiny_model_dir), "--output-dir", str(out), "--wandb.mode", "disabled",
              "--batch-timeout-s", "0.2"])
    assert exc.value.code == 1
    assert "timed out" in capsys.readouterr().err


TWO_RANK_CASES = {  # id: (loss normalization, lora, advantage, critic)
    "token": ("token", None, None, None),
    "sequence": ("sequence", None, None, None),
    "constant": ("constant", None, None, None),
    "lora": ("token", {"rank": 4, "modules_to_save": ["norm"]}, None, None),
    "gae_critic": ("token", None, {"type": "gae", "lam": 0.9}, None),
    "gae_value_head": ("token", None, {"type": "gae", "lam": 0.9}, HEAD),
    "decoupled_correction": ("token", None, None, None),
}
CORRECTION_CASES = {  # a case's [loss.correction]: the old-policy forward, the step's mean weight and a max metric
    "decoupled_correction": {"old_logprobs": "trainer", "weight": "token", "weight_batch_normalize": True,
                             "reject": [{"rule": "token_k1", "low": 0.05, "high": 20.0}]},
}
MICRO = {"micro_batches": 4, "completion_len": 9}


def case_config(model_dir: Path, out: Path, case: str) -> TrainerConfig:
    normalization, lora, advantage, critic = TWO_RANK_CASES[case]
    extra = {"advantage": advantage} if advantage else {}
    if critic is not None:
        extra |= {"critic": critic, "ckpt": {"interval": 1}}
    loss = {"type": "default", "normalization": normalization}
    if case in CORRECTION_CASES:
        loss = {"type": "grpo", "normalization": normalization, "correction": CORRECTION_CASES[case]}
    return config(model_dir, out, max_steps=1, loss=loss, lora=lora, **extra)


@pytest.fixture(scope="module")
def two_rank_runs(tiny_model_dir, tmp_path_factory) -> Path:
    """Every case trained on 2 gloo ranks under one torchrun (`tests/support/train_in_sequence.py`): a step of
    the same 4 micro-batches dealt over both ranks, in `<base>/<case>`."""
    from prime_rl.configs.toml_io import write_toml

    base = tmp_path_factory.mktemp("two_ranks")
    tomls = []
    for case, (_, _, advantage, _) in TWO_RANK_CASES.items():
        write_steps(base / case, [0], world_size=2, advantage=advantage, **MICRO)
        write_toml(base / f"{case}.toml", case_config(tiny_model_dir, base / case, case).model_dump(mode="json"))
        tomls.append(str(base / f"{case}.toml"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tests.support.train_in_sequence", *tomls],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return base


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TWO_RANK_CASES))
def test_torchrun_two_ranks_match_one_process(tiny_model_dir, tmp_path, two_rank_runs, case):
    """The same 4 micro-batches on 1 rank or dealt over 2 gloo ranks give the same update (to 1e-5); also
    with LoRA (frozen base, trainable adapters and trained norms sharded by FSDP2 together) and with a
    critic (GAE whitened over both ranks' tokens; the value loss normalised by the step's token count): a
    separate one, or a value head (replicated; its gradient summed over the ranks), whose state is compared
    in the checkpoints."""
    _, _, advantage, critic = TWO_RANK_CASES[case]
    one, two = tmp_path / "one", two_rank_runs / case
    write_steps(one, [0], world_size=1, advantage=advantage, **MICRO)
    # Uneven samples per micro-batch would be nicer, but the deal must be identical on both sides.
    train(case_config(tiny_model_dir, one, case))
    a, b = weights(one, 1), weights(two, 1)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0, msg=key)
    m1, m2 = metrics_lines(one)[0], metrics_lines(two)[0]
    assert m2["loss/total"] == pytest.approx(m1["loss/total"], abs=1e-5)
    assert m2["optim/grad_norm"] == pytest.approx(m1["optim/grad_norm"], rel=1e-5)
    for key in ("value/loss", "value/mean", "value/explained_variance", "value/grad_norm") if advantage else ():
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    correction_keys = [key for key in m1 if key.startswith("correction/")]
    assert bool(correction_keys) == (case in CORRECTION_CASES)
    for key in correction_keys:  # means, the step's weight mean (batch_norm_factor) and a max over both ranks
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
    if critic is not None:
        head_one, head_two = critic_state(one, 1), critic_state(two, 1)
        for key in head_one:
            torch.testing.assert_close(head_one[key], head_two[key], atol=1e-6, rtol=0, msg=key)


def critic_state(out: Path, step: int) -> dict[str, torch.Tensor]:
    """The value head's weight and bias in checkpoint step_N (any number of ranks wrote it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(ckpt_dir(out, step))).read_metadata().state_dict_metadata
    state = {"critic": {name: torch.empty(metadata[f"critic.{name}"].size) for name in ("weight", "bias")}}
    dcp.load(state, checkpoint_id=str(ckpt_dir(out, step)), no_dist=True)
    return state["critic"]


def test_keep_one_with_orchestrator_parts_ahead_keeps_the_trainers_newest(tiny_model_dir, tmp_path):
    """Regression: with `ckpt.keep = 1` the trainer counted the orchestrator's step folders
    (written ahead of it) and deleted its own newest checkpoint; 'latest' then found nothing complete."""
    out = tmp_path / "run"
    write_steps(out, range(3))
    for step in range(1, 6):  # the orchestrator ran up to max_async_level + 1 steps ahead
        (out / "checkpoints" / f"step_{step}" / "orchestrator").mkdir(parents=True)
    train(config(tiny_model_dir, out, max_steps=3, ckpt={"interval": 1, "keep": 1}))
    assert list_steps(out / "checkpoints") == [3, 4, 5]
    assert (ckpt_dir(out, 3) / "meta.json").exists()
    assert resolve_resume_step(out, "latest") == 3


@pytest.mark.slow
def test_resume_rewrites_the_pruned_weights_of_the_resume_step(tiny_model_dir, tmp_path):
    """Regression: with ckpt.interval > keep_weights the resume step's weights were pruned;
    nothing rewrote them and the orchestrator waited for them until its timeout."""
    out = tmp_path / "run"
    write_steps(out, range(6))
    train(config(tiny_model_dir, out, max_steps=6, keep_weights=1, ckpt={"interval": 4}))
    assert list_steps(out / "weights") == [6]
    assert list_steps(out / "checkpoints") == [4, 6]
    straight = weights(out, 6)
    shutil.rmtree(out / "weights" / "step_6")  # what `rl` does to weights after the resume step
    train(config(tiny_model_dir, out, max_steps=6, keep_weights=None, ckpt={"interval": 4, "resume_step": 4}))
    assert list_steps(out / "weights") == [4, 5, 6]
    for key, value in weights(out, 6).items():
        torch.testing.assert_close(value, straight[key], atol=0, rtol=0, msg=key)


def test_the_trainer_scores_under_the_samplers_truncation_unless_told_not_to():
    """`match_truncation` (default on): the batch's whole rule, so on-policy ratios are 1 under top-k/p, min-p;
    off: the full softmax at the batch temperature (the uncorrected ratio that the RL test shows is wrong)."""
    from prime_rl.batch_format import RankBatch
    from prime_rl.models.sampling_rule import SamplingRule
    from prime_rl.trainer.rl.train import scoring_rule

    batch = RankBatch(step=0, temperature=0.7, max_tokens=4, micro_batches=[], top_k=5, top_p=0.9, min_p=0.05)
    assert scoring_rule(batch, match_truncation=True) == SamplingRule(0.7, 5, 0.9, 0.05)
    assert scoring_rule(batch, match_truncation=False) == SamplingRule(0.7)
