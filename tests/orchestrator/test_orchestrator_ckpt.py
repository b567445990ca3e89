"""The orchestrator's checkpoint part carries a checksum manifest, verified before state.json is read;
the manifest helpers' edge cases."""

from __future__ import annotations

import json

import pytest

from prime_rl.orchestrator.orchestrator_ckpt import (
    OrchestratorState,
    load_state,
    rng_from_json,
    rng_to_json,
    save_state,
)
from prime_rl.run_dir import ORCHESTRATOR, checkpoint_dir
from prime_rl.utils.checksums import MANIFEST, CorruptCheckpoint, list_files, verify_manifest, write_manifest
from prime_rl.utils.errors import UserError


def saved(tmp_path, step: int = 3):
    import random

    state = OrchestratorState(step=step, env_cursors={"reverse-text": 12}, rng_state=rng_to_json(random.Random(5)))
    save_state(tmp_path, state)
    return state, checkpoint_dir(tmp_path, step, ORCHESTRATOR)


def test_state_round_trips_with_a_manifest(tmp_path):
    state, directory = saved(tmp_path)
    assert sorted(p.name for p in directory.iterdir()) == [MANIFEST, "state.json"]
    loaded = load_state(tmp_path, 3)
    assert loaded == state
    assert rng_from_json(loaded.rng_state).random() == rng_from_json(state.rng_state).random()


def test_a_changed_state_is_refused_naming_the_file(tmp_path):
    _, directory = saved(tmp_path)
    text = (directory / "state.json").read_text().replace('"reverse-text": 12', '"reverse-text": 99')
    (directory / "state.json").write_text(text)  # still valid JSON, same length
    with pytest.raises(CorruptCheckpoint, match=r"orchestrator/state\.json is corrupted \(sha256 mismatch\)"):
        load_state(tmp_path, 3)


def test_a_state_without_manifest_is_refused(tmp_path):
    _, directory = saved(tmp_path)
    (directory / MANIFEST).unlink()
    with pytest.raises(UserError, match=r"orchestrator has no manifest\.json"):
        load_state(tmp_path, 3)


def test_manifest_of_nested_and_empty_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"\x00" * 10)
    (tmp_path / ".hidden").write_bytes(b"")
    write_manifest(tmp_path)
    assert list_files(tmp_path) == [".hidden", "sub/a.bin"]
    verify_manifest(tmp_path)
    files = json.loads((tmp_path / MANIFEST).read_text())["files"]
    assert files[".hidden"] == {"size": 0, "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}
    (tmp_path / "sub" / "a.bin").write_bytes(b"\x00" * 9 + b"\x01")
    with pytest.raises(CorruptCheckpoint, match=r"sub/a\.bin is corrupted"):
        verify_manifest(tmp_path)


def test_a_verified_state_with_a_bad_rng_state_is_a_one_line_error(tmp_path):
    _, directory = saved(tmp_path)
    data = json.loads((directory / "state.json").read_text())
    data["rng_state"] = [3, [1, 2], None]  # random.setstate wants 625 ints
    (directory / "state.json").write_text(json.dumps(data))
    write_manifest(directory)
    with pytest.raises(UserError, match=r"^cannot read orchestrator checkpoint .*state\.json: "):
        load_state(tmp_path, 3)


@pytest.mark.parametrize("change", [{"env_cursors": {"reverse-text": -(10**30)}}, {"step": "3"}, {"step": True},
                                    {"env_cursors": {"reverse-text": 1.5}}])
def test_a_state_with_impossible_values_is_one_line_even_with_a_matching_manifest(tmp_path, change):
    """Regression: an edited state.json re-manifested crashed the orchestrator later."""
    save_state(tmp_path, OrchestratorState(step=3, env_cursors={"reverse-text": 12}))
    directory = checkpoint_dir(tmp_path, 3, ORCHESTRATOR)
    data = {**json.loads((directory / "state.json").read_text()), **change}
    (directory / "state.json").write_text(json.dumps(data))
    (directory / MANIFEST).unlink()
    write_manifest(directory)
    with pytest.raises(UserError, match="is not a step count"):
        load_state(tmp_path, 3)


def test_a_deeply_nested_manifest_is_one_line(tmp_path):
    save_state(tmp_path, OrchestratorState(step=1))
    directory = checkpoint_dir(tmp_path, 1, ORCHESTRATOR)
    (directory / MANIFEST).write_text('{"format": 1, "files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        verify_manifest(directory)


def curriculum_state() -> dict:
    import random

    return {"rng": rng_to_json(random.Random("7:curriculum")),
            "envs": {"dataset": {"size": 4, "history": {"0": [[2, 2]], "3": [[0, 2], [1, 2]]}}}}


def test_a_curriculum_state_round_trips_and_a_state_without_one_is_the_old_format(tmp_path):
    state = OrchestratorState(step=2, env_cursors={"dataset": 8}, curriculum=curriculum_state())
    save_state(tmp_path, state)
    assert load_state(tmp_path, 2) == state
    old = OrchestratorState(step=3, env_cursors={"dataset": 12})
    assert set(json.loads(old.to_json())) == {"step", "env_cursors", "rng_state"}  # as checkpoints before it
    assert OrchestratorState.from_json('{"step": 3, "env_cursors": {"dataset": 12}, "rng_state": null}') == old


@pytest.mark.parametrize(("change", "message"), [
    ({"envs": []}, "curriculum is not {rng, envs}"),
    ({"envs": {"dataset": {"size": 0, "history": {}}}}, "size = 0 is not a pool size"),
    ({"envs": {"dataset": {"size": 4, "history": {"4": [[1, 1]]}}}}, "example id '4' outside 0..3"),
    ({"envs": {"dataset": {"size": 4, "history": {"-1": [[1, 1]]}}}}, "example id '-1' outside 0..3"),
    ({"envs": {"dataset": {"size": 4, "history": {"1": [[3, 2]]}}}}, r"is not a list of \[passed, scored\]"),
    ({"envs": {"dataset": {"size": 4, "history": {"1": [[0, 0]]}}}}, r"is not a list of \[passed, scored\]"),
    ({"envs": {"dataset": {"size": 4, "history": {"1": []}}}}, r"is not a list of \[passed, scored\]"),
    ({"envs": {"dataset": {"size": 4, "history": {"1": [[True, 1]]}}}}, r"is not a list of \[passed, scored\]"),
    ({"rng": [3, [1, 2], None]}, "state.json: "),  # random.setstate refuses it
])
def test_an_impossible_curriculum_state_is_one_line(tmp_path, change, message):
    """An edited (re-manifested) curriculum state fails at load, in one line, not later in the run."""
    save_state(tmp_path, OrchestratorState(step=3, curriculum={**curriculum_state(), **change}))
    with pytest.raises(UserError, match=r"^cannot read orchestrator checkpoint .*" + message):
        load_state(tmp_path, 3)
