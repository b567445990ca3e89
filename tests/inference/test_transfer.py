"""Weight transfer over torch.distributed (gloo here): the weights a server stages after each update are bit for
bit those the same trainer writes to disk, with 1 and 2 trainer ranks; `rl` with it stays exactly on-policy (also
with two servers); broken transfers are refused in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.configs.toml_io import write_toml
from prime_rl.inference.builtin.engine import Engine
from prime_rl.inference.transfer import TransferReceiver
from prime_rl.run_dir import TRANSFER_MARKER as MARKER
from prime_rl.run_dir import weights_dir
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.rl.train import train
from prime_rl.utils.errors import UserError
from prime_rl.utils.net import free_port
from tests.support import REPO
from tests.support.rl_in_process import on_policy_run
from tests.support.synthetic_batches import random_step, write_random_step

pytestmark = [pytest.mark.slow]
VOCAB = 99  # the char tokenizer of tiny_model_dir


def trainer_config(model_dir, out, world_size: int, transfer: WeightTransferConfig | None = None) -> TrainerConfig:
    for step in range(2):
        write_random_step(out, step, world_size, random_step(VOCAB, step, 2))
    return TrainerConfig.build([], {
        "model": {"name": str(model_dir)}, "output_dir": str(out), "max_steps": 2, "seq_len": 64,
        "wandb": {"mode": "disabled"}, "runtime": {"deterministic": True}, "batch_timeout_s": 30.0,
        **({"weight_transfer": transfer.model_dump()} if transfer else {})})


def run_trainers(configs: list[TrainerConfig], ranks: int, tmp_path) -> None:
    """Each config in turn: in this process (1 rank) or under one torchrun (2 gloo ranks)."""
    if ranks == 1:
        for config in configs:
            train(config)
        return
    tomls = []
    for config in configs:
        tomls.append(tmp_path / f"trainer-{config.output_dir.name}.toml")
        write_toml(tomls[-1], config.model_dump(mode="json"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")} | {"OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "tests.support.train_in_sequence", *map(str, tomls)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("ranks", [1, 2])
def test_transferred_weights_are_bitwise_the_trainers(tiny_model_dir, tmp_path, ranks):
    expected = tmp_path / "filesystem"  # the same steps on as many ranks through the filesystem (deterministic)
    transfer = WeightTransferConfig(mode="distributed", address=f"127.0.0.1:{free_port()}", servers=1, timeout_s=120)
    engine = Engine(str(tiny_model_dir), context_len=64, seed=0, max_batch_size=2)
    receiver = TransferReceiver(transfer.model_copy(update={"rank": 1}), engine)
    try:
        out = tmp_path / "distributed"
        run_trainers([trainer_config(tiny_model_dir, expected, ranks),
                      trainer_config(tiny_model_dir, out, ranks, transfer)], ranks, tmp_path)
        step, staged = receiver.take(2, timeout_s=60)
    finally:
        engine.close()
    assert step == 2 and sorted(p.name for p in weights_dir(out, 2).iterdir()) == [MARKER]  # a marker, no weights
    want = load_file(weights_dir(expected, 2) / "model.safetensors")
    assert staged.tensors.keys() >= want.keys()
    for name, tensor in want.items():
        assert torch.equal(staged.tensors[name], tensor), name


def test_a_broken_transfer_is_refused_in_one_line_and_the_served_model_stays(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), context_len=64, seed=0, max_batch_size=2)
    try:
        good = {k: v.clone() for k, v in engine.model.state_dict().items()}
        cases = {
            "shape": ({**good, "model.norm.weight": torch.ones(65)}, "has shape [65]"),
            "nan": ({**good, "model.norm.weight": torch.full((64,), float("nan"))}, "holds NaN or infinite"),
            "unknown": ({**good, "model.extra.weight": torch.ones(3)}, "unexpected tensors"),
            "overflow": ({k: (v.half() if k == "model.norm.weight" else v) for k, v in good.items()}, None),
        }
        for name, (tensors, words) in cases.items():
            if words is None:  # float16 values are fine to serve in float32
                engine.stage_tensors(tensors, "transfer")
                continue
            with pytest.raises(UserError, match=re.escape(words)) as caught:
                engine.stage_tensors(tensors, "weight transfer of step 3")
            assert "\n" not in str(caught.value) and "weight transfer of step 3" in str(caught.value), name
        assert all(torch.equal(good[k], v) for k, v in engine.model.state_dict().items())
    finally:
        engine.close()


def test_no_update_over_the_group_is_a_timeout_naming_the_step(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), context_len=64, seed=0, max_batch_size=2)
    transfer = WeightTransferConfig(mode="distributed", address=f"127.0.0.1:{free_port()}", servers=1, rank=1,
                                    timeout_s=2)
    try:
        receiver = TransferReceiver(transfer, engine)  # no trainer ever joins: the group times out
        with pytest.raises(UserError, match="no weights of step >= 1 arrived over the transfer group"):
            receiver.take(1, timeout_s=10)
    finally:
        engine.close()


@pytest.mark.parametrize("servers", [1, 2])
def test_rl_with_distributed_transfer_stays_on_policy(tmp_path, servers):
    table = f'[weight_transfer]\nmode = "distributed"\n[inference]\nnum_servers = {servers}\n'
    run = on_policy_run(tmp_path, table, seq_len=256, max_tokens=8)  # mismatch KL < 1e-6 at every step
    assert sorted(p.name for p in weights_dir(tmp_path / "run", 3).iterdir()) == [MARKER]
    # Only markers on disk, yet every server served the weights of the last step trained on: they came over the group.
    assert sorted(run.served_steps) == ["inference", "inference_1"][:servers]
    assert all(step >= 2 for step in run.served_steps.values()), run.served_steps
    # The run's own rl.toml (what a resume runs) still parses: this run's group address is not in it.
    again = subprocess.run([sys.executable, "-m", "prime_rl.launch.rl", "@", str(tmp_path / "run" / "configs" /
                                                                              "rl.toml"), "--dry-run"],
                           capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if not k.startswith("PRIME_")})
    assert again.returncode == 0, again.stderr


def test_a_resumed_distributed_run_sends_the_resumed_weights_to_its_new_servers(tmp_path):
    """The previous run's marker of the resumed step names weights its servers got; the resumed trainer sends them
    to the new servers again, so the run goes on exactly on-policy (mismatch KL < 1e-6 at every step) instead of
    waiting for weights that never come."""
    table = '[weight_transfer]\nmode = "distributed"\n[ckpt]\ninterval = 1\n'
    on_policy_run(tmp_path, table, seq_len=256, max_tokens=8)
    run = on_policy_run(tmp_path, table, seq_len=256, max_tokens=8, max_steps=5, resume=True)
    assert sorted(run.rows("trainer")) == [0, 1, 2, 3, 4] and run.served_steps["inference"] >= 4
