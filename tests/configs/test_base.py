"""`configs.base.with_values`: derived values filled in on a copy, the original and the user's choices untouched;
`build` validates, then derives."""

from __future__ import annotations

import pytest

from prime_rl.configs.base import with_values
from prime_rl.launch.rl_config import RLConfig


def test_with_values_copies_along_each_path_and_leaves_the_original_alone():
    config = RLConfig.build([], {"inference": {"port": 9000}})
    before = config.model_dump()
    filled = with_values(config, {"inference.port": 9100, "inference.vllm.dtype": "half", "max_steps": 7})
    assert (filled.inference.port, filled.inference.vllm.dtype, filled.max_steps) == (9100, "half", 7)
    assert config.model_dump() == before
    filled.trainer.optim.lr = 0.5  # the copy shares no section with the original
    assert config.trainer.optim.lr != 0.5
    # Derived values do not count as set by the user; what the user set still does.
    assert "port" in filled.inference.model_fields_set and "dtype" not in filled.inference.vllm.model_fields_set
    assert "max_steps" not in filled.model_fields_set


def test_with_values_refuses_what_it_cannot_set():
    config = RLConfig.build()
    with pytest.raises(ValueError, match=r"\['inference'\] set both as a whole and in part"):
        with_values(config, {"inference": config.inference, "inference.port": 1})
    with pytest.raises(ValueError, match="RLConfig.orchestrator has no field 'trainer_world_sise'"):  # a typo
        with_values(config, {"orchestrator.trainer_world_sise": 7})
    with pytest.raises(ValueError, match="RLConfig.teacher is None, not a section"):
        with_values(config, {"teacher.base_url": "http://127.0.0.1:1/v1"})


def test_rl_hands_its_shared_keys_down_on_build_without_counting_them_as_set():
    config = RLConfig.build([], {"max_steps": 3, "seq_len": 512})
    assert config.trainer.max_steps == config.orchestrator.max_steps == 3
    assert config.inference.seq_len == config.trainer.seq_len == 512
    assert "max_steps" not in config.trainer.model_fields_set
    assert config.trainer.advantage == config.orchestrator.advantage


def test_a_component_value_that_contradicts_a_shared_one_is_refused():
    with pytest.raises(Exception, match="'trainer.max_steps' = 4 contradicts the shared value 3"):
        RLConfig.build([], {"max_steps": 3, "trainer": {"max_steps": 4}})
    with pytest.raises(Exception, match=r"'trainer.ckpt.interval' = 2 contradicts the shared value 5"):
        RLConfig.build([], {"ckpt": {"interval": 5}, "trainer": {"ckpt": {"interval": 2}}})
