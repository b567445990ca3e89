"""`weights`: a weight file is opened once and judged and read on its descriptor, so no rename between the check and
the read can make an update read a file outside the allowed roots."""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import stat
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from prime_rl.inference import weight_dirs as weights_module
from prime_rl.inference.builtin.app import BuiltinLoader
from prime_rl.inference.builtin.engine import Engine
from prime_rl.inference.gate import WeightGate
from prime_rl.inference.update import update_weights
from prime_rl.inference.weight_check import read_config, verify_weight_dir
from prime_rl.inference.weight_dirs import WeightPathForbidden, open_pinned, open_update_dir, open_weight_dir
from prime_rl.openai_api.protocol import UpdateWeightsRequest
from prime_rl.utils.errors import UserError
from tests.support.weight_dirs import EMBED

UPDATES = 600
OUTSIDE = 7.0  # every value of the outside file: a read of it shows in the served weights
AT_FDCWD, RENAME_EXCHANGE = -100, 2
# Between two flips the swapping thread sleeps this long, so each state lasts about as long as a step of an update:
# flipping without a pause (a thread that needs the GIL for each flip) left the unfixed code reading the outside file
# anywhere from 2 to 141 times in 300 updates, depending on the machine's load; with it, 10-50 times.
FILE_PAUSE_S, DIR_PAUSE_S = 0.0002, 0.001


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = Engine(str(tiny_model_dir), context_len=64, seed=0, max_batch_size=2)
    yield eng
    eng.close()


@pytest.fixture(params=["proc", "no_proc"])
def proc_fd(request, monkeypatch, tmp_path):
    """Both ways a descriptor is judged and read: through /proc/self/fd (Linux), and without /proc (the resolved
    name compared by device and inode, the file read whole through the descriptor)."""
    if request.param == "no_proc":
        monkeypatch.setattr(weights_module, "PROC_FD", tmp_path / "no-proc")
    elif not weights_module.PROC_FD.is_dir():
        pytest.skip("no /proc/self/fd here")
    return request.param


def outside_copy(model_dir: Path, path: Path) -> Path:
    """A copy of `model_dir` at `path` whose tensors fit the served model and hold only OUTSIDE."""
    shutil.copytree(model_dir, path)
    tensors = load_file(path / "model.safetensors")
    save_file({name: torch.full_like(t, OUTSIDE) for name, t in tensors.items()}, str(path / "model.safetensors"))
    return path


def file_swap(model_dir: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(root, step, outside file): `root/step_1` a copy of `model_dir`, and `step_1/kept.bin` a hard link of its
    `model.safetensors` (not *.safetensors: never listed), so the name can be put back in one rename."""
    root = tmp_path.resolve() / "weights"
    step = root / "step_1"
    shutil.copytree(model_dir, step)
    os.link(step / "model.safetensors", step / "kept.bin")
    return root, step, outside_copy(model_dir, tmp_path.resolve() / "elsewhere") / "model.safetensors"


def to_link(step: Path, outside: Path) -> None:
    """`step/model.safetensors` becomes a link to `outside` (one atomic rename)."""
    os.symlink(outside, step / "link.tmp")
    os.replace(step / "link.tmp", step / "model.safetensors")


def to_file(step: Path) -> None:
    """`step/model.safetensors` becomes the in-root file again (one atomic rename)."""
    os.link(step / "kept.bin", step / "file.tmp")
    os.replace(step / "file.tmp", step / "model.safetensors")


def updates_while(engine: Engine, path: Path, roots: tuple[Path, ...], swap) -> Counter:
    """UPDATES updates of `path` through the server's flow (`update_weights` with the builtin loader) while a thread
    calls `swap()` over and over; how each ended: "inside" (the in-root weights serve), "outside" (the outside
    file's values serve) or the refusal's status."""
    stop = threading.Event()

    def swapping():
        while not stop.is_set():
            swap()

    loader, gate = BuiltinLoader(engine, None, timeout_s=5), WeightGate(step=0, timeout_s=5)
    outcomes: Counter = Counter()

    async def run():
        for _ in range(UPDATES):
            status, payload = await update_weights(UpdateWeightsRequest(path=str(path), step=1), loader, roots, gate)
            if status != 200:
                assert "\n" not in payload["error"]["message"]
                outcomes[status] += 1
            else:
                outcomes["outside" if bool((engine.model.state_dict()[EMBED] == OUTSIDE).any()) else "inside"] += 1

    thread = threading.Thread(target=swapping, daemon=True)
    thread.start()
    try:
        asyncio.run(run())
    finally:
        stop.set()
        thread.join(5)
    return outcomes


@pytest.mark.slow
def test_a_file_swapped_with_a_link_outside_is_never_read(engine, tiny_model_dir, tmp_path, proc_fd):
    """`model.safetensors` flips between an in-root file and a link to an outside file while updates run: every
    update serves the in-root weights or is refused (403/400), none reads the outside file (the unfixed code, which
    checked the name and opened it again later, read it in 10-50 of 300 updates)."""
    root, step, outside = file_swap(tiny_model_dir, tmp_path)

    def swap():
        to_link(step, outside)
        time.sleep(FILE_PAUSE_S)
        to_file(step)
        time.sleep(FILE_PAUSE_S)

    outcomes = updates_while(engine, step, (root,), swap)
    assert outcomes["outside"] == 0, f"the outside file was read: {dict(outcomes)}"
    assert set(outcomes) <= {"inside", 400, 403} and outcomes["inside"] > 0, dict(outcomes)


@pytest.mark.parametrize("resolution", [1, 2], ids=["at_the_check", "after_the_open"])
def test_a_name_that_flips_while_it_is_resolved_is_refused(engine, tiny_model_dir, tmp_path, monkeypatch, proc_fd,
                                                          resolution):
    """The race `os.path.realpath` loses: the name is a link when it `lstat`s it and a file again when it `readlink`s
    it (EINVAL). Made to happen at the `resolution`-th resolving of `model.safetensors` (1: the root check before the
    open; 2: without /proc, the check of the open file), the update ends in the server's 400 with a one-line
    message, never an unhandled OSError, and the served weights stay the model's own."""
    if resolution == 2 and proc_fd == "proc":
        pytest.skip("with /proc the open file is judged by its descriptor's path: the name is resolved once")
    root, step, outside = file_swap(tiny_model_dir, tmp_path)
    name = str(step / "model.safetensors")
    lstat, readlink = os.lstat, os.readlink
    seen = {"lstat": 0, "flipped": False}

    def flipping_lstat(path, *args, **kwargs):
        if os.fspath(path) == name:
            seen["lstat"] += 1
            if seen["lstat"] == resolution:
                to_link(step, outside)
        return lstat(path, *args, **kwargs)

    def flipping_readlink(path, *args, **kwargs):
        if os.fspath(path) == name and seen["lstat"] == resolution and not seen["flipped"]:
            seen["flipped"] = True
            to_file(step)
        return readlink(path, *args, **kwargs)

    before = engine.model.state_dict()[EMBED].clone()
    monkeypatch.setattr(os, "lstat", flipping_lstat)
    monkeypatch.setattr(os, "readlink", flipping_readlink)
    loader, gate = BuiltinLoader(engine, None, timeout_s=5), WeightGate(step=0, timeout_s=5)
    status, payload = asyncio.run(update_weights(UpdateWeightsRequest(path=str(step), step=1), loader, (root,), gate))
    monkeypatch.undo()
    assert seen["flipped"], "the name never flipped between lstat and readlink: the race was not made"
    assert status == 400, payload
    message = payload["error"]["message"]
    assert "\n" not in message and "model.safetensors" in message and "Invalid argument" in message, message
    assert torch.equal(engine.model.state_dict()[EMBED], before)


def exchanger():
    """`exchange(a, b)`: swap two names atomically (Linux renameat2 RENAME_EXCHANGE; OSError where it fails)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 here")

    def exchange(a: Path, b: Path) -> None:
        if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2 RENAME_EXCHANGE")

    return exchange


def test_a_step_directory_swapped_with_a_link_outside_is_never_read(engine, tiny_model_dir, tmp_path):
    """The step directory itself flips between the in-root directory and a link to an outside one (one atomic
    exchange of the two names): a directory of the path is judged on the open file's real path, never read through."""
    root = tmp_path.resolve() / "weights"
    step, link = root / "step_1", root / "link"
    shutil.copytree(tiny_model_dir, step)
    link.symlink_to(outside_copy(tiny_model_dir, tmp_path.resolve() / "elsewhere" / "step_1"))
    exchange = exchanger()
    try:
        exchange(step, link)
        exchange(step, link)
    except OSError as exc:
        pytest.skip(f"no atomic exchange of names here: {exc}")

    def swap():
        exchange(step, link)
        time.sleep(DIR_PAUSE_S)

    outcomes = updates_while(engine, step, (root,), swap)
    assert outcomes["outside"] == 0, f"the outside directory was read: {dict(outcomes)}"
    assert set(outcomes) <= {"inside", 400, 403} and outcomes["inside"] > 0, dict(outcomes)


def test_an_open_update_reads_the_files_it_checked_whatever_their_names_become(tiny_model_dir, tmp_path, proc_fd):
    """Once open, the config and the tensors come from the descriptors: a name swapped for a link outside after the
    check changes nothing that is read."""
    root, step, outside = file_swap(tiny_model_dir, tmp_path)
    expected = load_file(step / "model.safetensors")
    with open_update_dir(step, None, (root,)) as weights:
        to_link(step, outside)
        (step / "config.json").unlink()
        (step / "config.json").symlink_to(outside.parent / "config.json")
        tensors = verify_weight_dir(weights, None, keep=True)
        assert read_config(weights)["hidden_size"] == 64
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    with pytest.raises(WeightPathForbidden, match="outside the allowed weight directories"):
        open_update_dir(step, None, (root,))


def test_a_file_that_became_a_link_between_the_check_and_the_open_is_refused(tiny_model_dir, tmp_path, monkeypatch,
                                                                              proc_fd):
    """The resolved name is opened with O_NOFOLLOW, and the opened file must really lie under a root."""
    root, step, outside = file_swap(tiny_model_dir, tmp_path)
    resolve = weights_module.resolve_allowed

    def then_swap(path, roots):  # the check sees the in-root file; the name is a link by the time it is opened
        real = resolve(path, roots)
        if Path(path).name == "model.safetensors":
            to_link(step, outside)
        return real

    monkeypatch.setattr(weights_module, "resolve_allowed", then_swap)
    with pytest.raises(UserError, match="cannot read weight file .*model.safetensors"):
        open_update_dir(step, None, (root,))
    to_file(step)
    elsewhere = tmp_path.resolve() / "elsewhere"

    def then_move_dir(path, roots):  # a directory of the path becomes a link outside after the check
        real = resolve(path, roots)
        if Path(path).name == "model.safetensors" and not step.is_symlink():
            step.rename(root / "parked")
            step.symlink_to(elsewhere)
        return real

    monkeypatch.setattr(weights_module, "resolve_allowed", then_move_dir)
    with pytest.raises(WeightPathForbidden, match="model.safetensors is outside the allowed weight directories"):
        open_update_dir(step, None, (root,))


def test_a_pinned_file_opens_elsewhere_only_while_it_is_the_file_checked(tiny_model_dir, tmp_path, proc_fd):
    """The vLLM workers open the checked files again (`open_pinned`): the very files, or nothing."""
    root, step, outside = file_swap(tiny_model_dir, tmp_path)
    with open_update_dir(step, None, (root,)) as weights:
        pins = weights.pins()
        assert [pin[:2] for pin in pins] == [("model.safetensors", str(step / "model.safetensors"))]
        with open_pinned(step, pins) as again:
            assert set(verify_weight_dir(again, None, keep=True)) == set(load_file(step / "kept.bin"))
        to_link(step, outside)
        with pytest.raises(UserError, match="is not the file that was checked: it was replaced"):
            open_pinned(step, pins)
        shutil.copy(step / "kept.bin", step / "copy.tmp")  # the same bytes in another file are refused too
        os.replace(step / "copy.tmp", step / "model.safetensors")
        with pytest.raises(UserError, match="it was replaced"):
            open_pinned(step, pins)


def test_a_private_copy_holds_the_checked_bytes_and_only_its_owner_reads_it(tiny_model_dir, tmp_path):
    root, step, outside = file_swap(tiny_model_dir, tmp_path)
    expected = {name: (step / name).read_bytes() for name in ("config.json", "model.safetensors")}
    with open_update_dir(step, None, (root,)) as weights:
        to_link(step, outside)
        copy = weights.private_copy()
    try:
        assert stat.S_IMODE(copy.stat().st_mode) == 0o700
        assert {path.name: path.read_bytes() for path in copy.iterdir()} == expected
    finally:
        shutil.rmtree(copy)


def test_a_trusted_directory_follows_its_links(tiny_model_dir, tmp_path):
    """The served model's own directory (a hub snapshot's files are links into its blobs) opens without roots."""
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).symlink_to(tiny_model_dir / name)
    with open_weight_dir(snapshot) as weights:
        assert sorted(weights.files) == ["config.json", "model.safetensors"] and not weights.is_adapter
        assert read_config(weights)["hidden_size"] == 64
