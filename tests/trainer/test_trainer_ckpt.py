"""Trainer checkpoints: JSON state and a checksum manifest; loading verifies
every file first, fails in one line naming it, and never unpickles anything that could run code."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from prime_rl.trainer.config import OptimConfig, SchedulerConfig
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.optim import build_optimizer, build_scheduler, non_finite_parameters
from prime_rl.trainer.trainer_ckpt import ckpt_dir, load_checkpoint, save_checkpoint
from prime_rl.utils.checksums import MANIFEST, CorruptCheckpoint, write_manifest
from prime_rl.utils.errors import PrimeError, UserError
from prime_rl.utils.json_state import dumps_exact
from tests.support.two_ranks import gloo_rank


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def trained(steps: int = 2, seed: int = 0):
    """An FSDP2-wrapped model, AdamW and a warm-up + linear schedule after `steps` steps."""
    torch.manual_seed(seed)
    model = Net()
    fully_shard(model)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1))
    scheduler = build_scheduler(optimizer, SchedulerConfig(type="linear", warmup_steps=3), max_steps=10)
    for _ in range(steps):
        model(torch.randn(3, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def params(model) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.named_parameters()}


@pytest.fixture(scope="module", autouse=True)
def process_group():
    init_distributed()


@pytest.fixture
def saved(tmp_path):
    model, optimizer, scheduler = trained()
    save_checkpoint(tmp_path, 2, model, optimizer, scheduler, extra={"note": "x"})
    return tmp_path, ckpt_dir(tmp_path, 2)


def test_checkpoint_holds_json_state_and_a_manifest_of_every_file(saved):
    _, directory = saved
    names = {p.name for p in directory.iterdir()}
    assert names == {".metadata", "__0_0.distcp", "meta.json", "rank_0.json", MANIFEST}
    files = json.loads((directory / MANIFEST).read_text())["files"]
    assert set(files) == names - {MANIFEST}
    for name, entry in files.items():
        assert entry["size"] == (directory / name).stat().st_size
        assert len(entry["sha256"]) == 64
    assert not list(directory.parent.glob(".*.tmp"))


def test_resume_restores_weights_optimizer_scheduler_and_rng_exactly(saved):
    out, _ = saved
    random.seed(123)
    model, optimizer, scheduler = trained()
    save_checkpoint(out, 3, model, optimizer, scheduler)
    # What an uninterrupted run draws next:
    expected_draws = (torch.rand(4), [random.random() for _ in range(3)])
    expected_sched, expected_params = scheduler.state_dict(), params(model)
    expected_optim = get_state_dict(model, optimizer)[1]["state"]

    other, other_opt, other_sched = trained(steps=0, seed=7)
    torch.manual_seed(999)
    random.seed(999)
    assert load_checkpoint(out, 3, other, other_opt, other_sched) == {}
    draws = (torch.rand(4), [random.random() for _ in range(3)])
    assert torch.equal(draws[0], expected_draws[0]) and draws[1] == expected_draws[1]
    assert other_sched.state_dict() == expected_sched
    assert other_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    for name, value in params(other).items():
        assert torch.equal(value, expected_params[name]), name
    loaded_optim = get_state_dict(other, other_opt)[1]["state"]
    for name, state in expected_optim.items():
        for key, value in state.items():
            got, want = (t.full_tensor() if isinstance(t, DTensor) else t for t in (loaded_optim[name][key], value))
            assert torch.equal(got, want), (name, key)
    assert load_checkpoint(out, 2, other, other_opt, other_sched) == {"note": "x"}


def flip(path, offset: int = 64, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    offset = min(offset, len(data) - count)
    data[offset:offset + count] = bytes(b ^ 0xFF for b in data[offset:offset + count])
    path.write_bytes(bytes(data))


def truncate(path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


DAMAGE = {
    "flipped shard": (lambda d: flip(d / "__0_0.distcp"), r"__0_0\.distcp is corrupted \(sha256 mismatch\)"),
    "truncated shard": (lambda d: truncate(d / "__0_0.distcp"), r"__0_0\.distcp is truncated"),
    "grown shard": (lambda d: (d / "__0_0.distcp").open("ab").write(b"x"), r"__0_0\.distcp is longer than written"),
    "flipped dcp metadata": (lambda d: flip(d / ".metadata"), r"\.metadata is corrupted"),
    "missing dcp metadata": (lambda d: (d / ".metadata").unlink(), r"\.metadata is missing"),
    "flipped meta": (lambda d: flip(d / "meta.json", 2, 1), r"meta\.json is corrupted"),
    "missing rank file": (lambda d: (d / "rank_0.json").unlink(), r"rank_0\.json is missing"),
    "extra file": (lambda d: (d / "__1_0.distcp").write_bytes(b"?"), r"unexpected file .*__1_0\.distcp"),
    "extra folder file": (lambda d: (d / "sub").mkdir() or (d / "sub" / "x").write_text("?"),
                          r"unexpected file .*sub/x"),
    "no manifest": (lambda d: (d / MANIFEST).unlink(), r"has no manifest\.json: .*older prime-rl"),
    "bad manifest": (lambda d: (d / MANIFEST).write_text("{not json"), r"manifest .*manifest\.json is unreadable"),
    "manifest escaping": (lambda d: (d / MANIFEST).write_text(json.dumps(
        {"format": 1, "files": {"../x": {"size": 1, "sha256": "0"}}})), r"'\.\./x' is not inside"),
    "manifest of another format": (lambda d: (d / MANIFEST).write_text(json.dumps({"format": 9, "files": {}})),
                                   r"unknown format 9"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_fails_in_one_line_naming_the_file_before_loading_anything(saved, damage):
    out, directory = saved
    make_damage, message = DAMAGE[damage]
    make_damage(directory)
    model, optimizer, scheduler = trained(steps=0, seed=5)
    before = params(model)
    with pytest.raises(CorruptCheckpoint, match=message) as exc:
        load_checkpoint(out, 2, model, optimizer, scheduler)
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)
    assert all(torch.equal(v, before[k]) for k, v in params(model).items())  # nothing was read


class Marker:
    """Unpickling it creates `path` (what a malicious pickle could do, only harmless)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_old_pickle_files_are_never_unpickled(saved, tmp_path):
    out, directory = saved
    marker = tmp_path / "pwned"
    for name in ("meta.pt", "rank_0.pt"):
        torch.save({"payload": Marker(marker)}, directory / name)
    model, optimizer, scheduler = trained(steps=0)
    with pytest.raises(CorruptCheckpoint, match=r"unexpected file .*meta\.pt"):
        load_checkpoint(out, 2, model, optimizer, scheduler)
    # Even listed in a matching manifest (an attacker can write one), they are not read ...
    write_manifest(directory)
    load_checkpoint(out, 2, model, optimizer, scheduler)
    # ... nor in an old checkpoint, which has no manifest and no JSON state.
    for name in ("meta.json", "rank_0.json", MANIFEST):
        (directory / name).unlink()
    with pytest.raises(CorruptCheckpoint, match="has no manifest.json"):
        load_checkpoint(out, 2, model, optimizer, scheduler)
    assert not marker.exists()


def test_a_malicious_dcp_metadata_is_refused_in_one_line(saved, tmp_path):
    out, directory = saved
    marker = tmp_path / "pwned"
    (directory / ".metadata").write_bytes(pickle.dumps(Marker(marker)))
    write_manifest(directory)
    model, optimizer, scheduler = trained(steps=0)
    with pytest.raises(UserError, match=r"cannot load checkpoint .*: UnpicklingError: refusing to load global "
                                        r"(builtins|io)\.open$"):
        load_checkpoint(out, 2, model, optimizer, scheduler)
    assert not marker.exists()


def test_a_malicious_optimizer_value_is_refused_in_one_line(saved, tmp_path):
    """DCP stores non-tensor values (param_groups' lr, betas...) as pickles it loads with weights_only=False."""
    out, directory = saved
    marker = tmp_path / "pwned"
    model, optimizer, scheduler = trained()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    optim_sd["param_groups"][0]["lr"] = Marker(marker)
    for name in (".metadata", "__0_0.distcp"):
        (directory / name).unlink()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
    write_manifest(directory)
    with pytest.raises(UserError, match=r"cannot load checkpoint .*UnpicklingError: Weights only load failed") as exc:
        load_checkpoint(out, 2, model, optimizer, scheduler)
    assert "\n" not in str(exc.value)
    assert not marker.exists()


def test_a_checkpoint_of_another_model_fails_in_one_line(saved):
    out, _ = saved
    model = torch.nn.Linear(4, 3)
    fully_shard(model)
    optimizer = build_optimizer(model, OptimConfig())
    scheduler = build_scheduler(optimizer, SchedulerConfig(), max_steps=10)
    with pytest.raises(UserError, match=r"^cannot load checkpoint .*step_2/trainer: \w+: ") as exc:
        load_checkpoint(out, 2, model, optimizer, scheduler)
    assert "\n" not in str(exc.value)


def head_critic():
    """What the checkpoint reads of a critic: its `model` and `optimizer` (here a value head's shape)."""
    head = torch.nn.Linear(8, 1)
    return SimpleNamespace(model=head, optimizer=build_optimizer(head, OptimConfig()))


@pytest.mark.parametrize("saved_kind, resumed_kind, refused", [
    ("value_head", "separate", "with a value head (critic.type 'value_head') but this run has a separate critic"),
    ("separate", "value_head", "with a separate critic (critic.type 'separate') but this run has a value head"),
    (True, "value_head", "with a separate critic"),  # written before value heads: its critic was a separate model
    ("value_head", None, "with a value head (critic.type 'value_head') but this run has no critic"),
    (None, "value_head", "with no critic but this run has a value head"),
    (True, "separate", None),
    ("value_head", "value_head", None),
])
def test_a_checkpoint_resumes_only_with_the_kind_of_critic_it_trained(tmp_path, saved_kind, resumed_kind, refused):
    model, optimizer, scheduler = trained()
    critic = head_critic() if saved_kind else None
    save_checkpoint(tmp_path, 2, model, optimizer, scheduler, identity={"lora": None, "critic": saved_kind},
                    critic=critic)
    before = params(model)
    fresh_model, fresh_optimizer, fresh_scheduler = trained(steps=0, seed=1)
    fresh_critic = head_critic() if resumed_kind else None
    identity = {"lora": None, **({"critic": resumed_kind} if resumed_kind else {})}
    if refused is None:
        load_checkpoint(tmp_path, 2, fresh_model, fresh_optimizer, fresh_scheduler, identity, fresh_critic)
        assert torch.equal(fresh_critic.model.weight, critic.model.weight)
        return
    untouched = params(fresh_model)
    with pytest.raises(UserError, match=re.escape(refused)) as exc:
        load_checkpoint(tmp_path, 2, fresh_model, fresh_optimizer, fresh_scheduler, identity, fresh_critic)
    assert "\n" not in str(exc.value)
    assert "resume with the checkpoint's advantage type and critic.type" in str(exc.value)
    assert all(torch.equal(untouched[k], v) for k, v in params(fresh_model).items())  # nothing loaded
    assert any(not torch.equal(before[k], v) for k, v in untouched.items())


class Schedule:
    """A callable lr lambda: LambdaLR saves its __dict__, here with a tuple JSON would turn into a list."""

    def __init__(self):
        self.milestones = (1, 2)

    def __call__(self, step):
        return 1.0


def test_scheduler_state_json_cannot_restore_fails_at_save_before_writing(tmp_path):
    model, optimizer, _ = trained(steps=0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule())
    with pytest.raises(PrimeError, match=r"cannot save checkpoint meta\.scheduler\.lr_lambdas\[0\]\.milestones: tuple"):
        save_checkpoint(tmp_path, 1, model, optimizer, scheduler)
    assert not (tmp_path / "checkpoints").exists()


def test_non_finite_parameters_names_nan_and_inf_and_skips_empty_shards():
    model, _, _ = trained(steps=0)
    assert non_finite_parameters(model) == []
    with torch.no_grad():
        model.b.weight.to_local()[0, 1] = float("nan")
        model.a.bias.to_local()[3] = float("-inf")
    assert non_finite_parameters(model) == ["a.bias", "b.weight"]
    empty = torch.nn.Module()
    empty.w = torch.nn.Parameter(torch.empty(0, 3))  # as a rank's FSDP shard of a small parameter can be
    assert non_finite_parameters(empty) == []


def _two_rank_worker(rank: int, store: str, out: str) -> None:
    with gloo_rank(rank, store):
        _save_damage_and_load(rank, out)


def _save_damage_and_load(rank: int, out: str) -> None:
    """One rank's part: its model, optimizer and scheduler live in this function, gone before the group is."""
    from pathlib import Path

    model, optimizer, scheduler = trained()
    save_checkpoint(Path(out), 2, model, optimizer, scheduler)
    result = {"files": sorted(json.loads((ckpt_dir(Path(out), 2) / MANIFEST).read_text())["files"])}
    with torch.no_grad():
        if rank == 1:  # only rank 1's shard of a.weight goes bad: both ranks must see it
            model.a.weight.to_local()[0, 0] = float("nan")
    result["bad"] = non_finite_parameters(model)
    dist.barrier()
    if rank == 0:
        flip(ckpt_dir(Path(out), 2) / "__1_0.distcp")
    dist.barrier()
    try:
        load_checkpoint(Path(out), 2, model, optimizer, scheduler)
    except CorruptCheckpoint as exc:
        result["error"] = str(exc)
    Path(out, f"result_{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
def test_two_ranks_manifest_covers_every_rank_and_both_ranks_stop_on_damage(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    results = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in range(2)]
    assert results[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json", "rank_0.json",
                                   "rank_1.json"]
    assert results[0]["bad"] == results[1]["bad"] == ["a.weight"]
    assert results[0]["error"] == results[1]["error"]
    assert "__1_0.distcp is corrupted (sha256 mismatch)" in results[0]["error"]
    shutil.rmtree(tmp_path / "checkpoints")


@pytest.mark.parametrize(("value", "message"), [
    ({"x": {1: 2}}, r"state\.x: key 1 is not a string"),
    ({"x": (1, 2)}, r"state\.x: tuple"),
    ({"x": [1, {"y": object()}]}, r"state\.x\[1\]\.y: object"),
    ({"x": torch.zeros(1)}, r"state\.x: Tensor"),
])
def test_state_json_refuses_what_it_would_not_restore_exactly(value, message):
    with pytest.raises(PrimeError, match=r"cannot save " + message):
        dumps_exact(value, "state")


def test_state_json_round_trips_floats_exactly():
    value = {"a": [0.1, 1 / 3, 1e-300, float("inf"), -0.0, True, None, 2**62], "b": {"c": "d"}}
    assert json.loads(dumps_exact(value, "state")) == value


def test_non_finite_parameters_does_not_flag_a_finite_tensor_whose_norm_overflows():
    model, _, _ = trained(steps=0)
    with torch.no_grad():
        model.a.weight.to_local().fill_(1e30)  # its L2 norm is inf in float32, every entry finite
    assert non_finite_parameters(model) == []
    with torch.no_grad():
        model.a.weight.to_local()[1, 1] = float("inf")
    assert non_finite_parameters(model) == ["a.weight"]
