"""Reading rollout batches: hand-written batch files, checked against the step and max_async_level."""

from __future__ import annotations

import pytest
import torch

from prime_rl.configs.cli import build_config
from prime_rl.launch.rl_config import RLConfig
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.run_dir import rollout_dir, rollout_file
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.rl.rollout_batches import wait_for_batch
from prime_rl.utils.errors import ConfigError, PrimeError

STEP = 5


def micro_batch(samples: list[tuple[int, bool]]) -> dict:
    """A packed row of 3-token samples (1 prompt + 2 completion tokens), given as (policy_step, trains)."""
    mask = [t for _, trains in samples for t in (False, trains, trains)]
    n = len(mask)
    return {
        "input_ids": torch.arange(n, dtype=torch.long),
        "position_ids": torch.tensor([0, 1, 2] * len(samples), dtype=torch.long),
        "sample_lens": torch.full((len(samples),), 3, dtype=torch.long),
        "loss_mask": torch.tensor(mask, dtype=torch.bool),
        "inference_logprobs": torch.tensor([-0.5 if m else 0.0 for m in mask]),
        "advantages": torch.tensor([1.0 if m else 0.0 for m in mask]),
        "policy_step": torch.tensor([p for p, _ in samples], dtype=torch.long),
    }


def write_batch(output_dir, *rows: list[tuple[int, bool]], temperature: float = 1.0, **truncation) -> None:
    """rollouts/step_5/rank_0.pt written by hand, in the documented format (batch_format.py); `truncation`:
    top_k / top_p / min_p keys (none: a file of a version before them)."""
    directory = rollout_dir(output_dir, STEP)
    directory.mkdir(parents=True)
    payload = {"step": STEP, "temperature": temperature, "max_tokens": 2, **truncation,
               "micro_batches": [micro_batch(row) for row in rows]}
    torch.save(payload, rollout_file(directory, 0))


def read(output_dir, max_async_level):
    return wait_for_batch(output_dir, STEP, 0, timeout_s=1.0, max_async_level=max_async_level)[0]


@pytest.mark.parametrize("max_async_level", [0, 1, 2, 5, 9])
def test_policy_steps_within_the_bound_are_read(tmp_path, max_async_level):
    low = max(0, STEP - max_async_level)
    write_batch(tmp_path, [(low, True), (STEP, True)], [(STEP, True)])
    batch = read(tmp_path, max_async_level)
    assert [mb.policy_step.tolist() for mb in batch.micro_batches] == [[low, STEP], [STEP]]


@pytest.mark.parametrize(("max_async_level", "policy_step", "bound"),
                         [(0, 4, "[5, 5]"), (1, 3, "[4, 5]"), (2, 2, "[3, 5]"), (2, 6, "[3, 5]"), (9, -1, "[0, 5]")])
def test_a_sample_outside_the_bound_is_an_error_naming_step_policy_step_and_bound(tmp_path, max_async_level,
                                                                                  policy_step, bound):
    write_batch(tmp_path, [(STEP, True)], [(STEP, True), (policy_step, True)])
    with pytest.raises(PrimeError) as err:
        read(tmp_path, max_async_level)
    message = str(err.value)
    assert f"of step {STEP} has a sample with policy_step {policy_step}, outside {bound}" in message
    assert f"max_async_level {max_async_level}" in message and "\n" not in message


def test_samples_that_train_nothing_are_not_checked(tmp_path):
    # A padding row (policy_step 0) and a masked sample train no token, so their policy step is moot.
    write_batch(tmp_path, [(STEP, True), (1, False)], [(0, False)])
    assert len(read(tmp_path, 1).micro_batches) == 2


def test_without_max_async_level_policy_steps_are_not_checked(tmp_path):
    write_batch(tmp_path, [(0, True)])
    assert read(tmp_path, None).micro_batches[0].policy_step.tolist() == [0]


@pytest.mark.parametrize("temperature", [0.0, float("inf"), float("nan")])
def test_a_batch_with_an_untrainable_temperature_is_an_error(tmp_path, temperature):
    write_batch(tmp_path, [(STEP, True)], temperature=temperature)
    with pytest.raises(PrimeError, match=f"has sampling temperature {temperature}: the trainer divides logits by it"):
        read(tmp_path, 1)


def test_the_truncation_is_read_and_a_file_without_it_samples_untruncated(tmp_path):
    write_batch(tmp_path / "new", [(STEP, True)], top_k=20, top_p=0.9, min_p=0.05)
    assert read(tmp_path / "new", 1).rule == SamplingRule(1.0, 20, 0.9, 0.05)
    write_batch(tmp_path / "old", [(STEP, True)])
    assert not read(tmp_path / "old", 1).rule.truncates


@pytest.mark.parametrize("truncation", [{"top_k": -2}, {"top_p": 0.0}, {"top_p": float("nan")}, {"min_p": 1.5},
                                        {"min_p": -0.1}])
def test_a_batch_with_an_invalid_truncation_is_an_error(tmp_path, truncation):
    write_batch(tmp_path, [(STEP, True)], **truncation)
    with pytest.raises(PrimeError, match="has an invalid truncation"):
        read(tmp_path, 1)


def test_trainer_config_gets_max_async_level_from_rl(tmp_path):
    assert TrainerConfig.model_fields["max_async_level"].default == OrchestratorConfig.model_fields[
        "max_async_level"].default
    config = build_config(RLConfig, ["--max-async-level", "3"])[0]
    assert config.trainer.max_async_level == config.orchestrator.max_async_level == 3
    with pytest.raises(ConfigError, match=r"'trainer.max_async_level' = 2 contradicts the shared value 3"):
        build_config(RLConfig, ["--max-async-level", "3", "--trainer.max-async-level", "2"])
