"""What the viewer reads of a run (`viewer/collect.py`) and its command (`prime-rl view`): samples joined with the
trainer's token outcomes by key, token texts from the run's tokenizer, bounds, and one-line errors."""

from __future__ import annotations

import json

import pytest

from prime_rl.run_dir import rollout_dir, samples_file, viewer_page
from prime_rl.viewer.collect import collect, token_texts
from prime_rl.viewer.view import main as prime_rl
from tests.support.sample_runs import samples_run


def ids_as_text(ids: list[int]) -> dict[int, str]:
    return {i: f"<{i}>" for i in ids}


def test_each_sample_gets_the_trainer_record_of_its_key_and_every_token_id_a_text(tmp_path):
    run = collect(samples_run(tmp_path, steps=2, groups=4, per_group=2), decode=ids_as_text)
    assert sorted(run.steps) == [0, 1] and len(run.steps[0]) == 8
    for row in run.steps[1]:
        tokens = row["tokens"][0]
        if row["kept"]:
            assert len(tokens["trainer_logprobs"]) == len(tokens["outcomes"]) == len(tokens["ids"])
        else:  # a dropped group trains nothing: the trainer wrote no record of it
            assert "outcomes" not in tokens
    every_id = {i for rows in run.steps.values() for row in rows for i in row["tokens"][0]["ids"]}
    assert set(run.vocab) == every_id and run.vocab[every_id.pop()].startswith("<")


def test_a_step_range_a_left_out_line_and_a_cut_line_are_read_as_written(tmp_path):
    root = samples_run(tmp_path, steps=4, groups=2, per_group=2)
    with open(samples_file(rollout_dir(root, 2)), "a") as f:
        f.write(json.dumps({"step": 2, "left_out": 5}) + "\n" + '{"step": 2, "env": "cut by a kil')
    run = collect(root, range(1, 3), decode=ids_as_text)
    assert sorted(run.steps) == [1, 2] and len(run.steps[2]) == 4 and run.left_out == {2: 5}


def test_tokens_decode_with_the_runs_own_tokenizer_or_show_as_ids_with_the_reason(tmp_path):
    root = samples_run(tmp_path, steps=1, groups=1, per_group=1)
    (root / "configs").mkdir()
    (root / "configs" / "trainer.toml").write_text('[model]\nname = "tiny-reverse-text"\n')
    run = collect(root)
    assert run.notes == [] and all(len(text) == 1 for text in run.vocab.values())  # the char tokenizer: one each
    (root / "configs" / "trainer.toml").write_text('[model]\nname = "/nowhere/model"\n')
    run = collect(root)
    assert run.vocab[next(iter(run.vocab))].startswith("#") and run.notes[0].startswith("tokens are shown as ids")


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
@pytest.mark.slow
def test_token_texts_of_a_real_tokenizer_keep_their_spaces_and_special_tokens(name):
    from tests.support.real_tokenizers import load_tokenizer

    tokenizer = load_tokenizer(name)
    ids = tokenizer.encode(" hello world,\n  again", add_special_tokens=False)
    texts = token_texts(tokenizer, ids + [tokenizer.eos_token_id])
    assert "".join(texts[i] for i in ids) == " hello world,\n  again" and texts[ids[1]] == " world"
    assert texts[tokenizer.eos_token_id] == tokenizer.eos_token


def test_prime_rl_view_writes_the_page_into_the_run_directory(tmp_path, capsys):
    root = samples_run(tmp_path, steps=2, groups=2, per_group=2)
    prime_rl(["view", str(root)])
    assert viewer_page(root).read_text().startswith("<!doctype html>")
    assert f"wrote {viewer_page(root)}" in capsys.readouterr().out
    prime_rl(["view", str(root), "-o", str(tmp_path / "elsewhere.html"), "--steps", "1:"])
    assert 'id="step-1"' in (page := (tmp_path / "elsewhere.html").read_text()) and 'id="step-0"' not in page


@pytest.mark.parametrize(("args", "words"), [
    (["view", "{tmp}/nowhere"], "is not a run directory"),
    (["view", "{tmp}/empty"], "holds no samples.jsonl"),
    (["view", "{tmp}/empty", "--steps", "4:1"], "the last step comes before the first"),
    (["view", "{tmp}/empty", "--steps", "a:b"], "expected A:B"),
    (["view", "{tmp}/steps", "--steps", "5:9"], "no step of"),
    (["view", "{tmp}/steps", "--port", "8000"], "--port is the port of --serve"),
    (["look", "{tmp}"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    (tmp_path / "empty" / "rollouts" / "step_0").mkdir(parents=True)
    (tmp_path / "steps").mkdir()
    samples_run(tmp_path / "steps", steps=2, groups=1, per_group=1)
    with pytest.raises(SystemExit) as exit_info:
        prime_rl([a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("error:") and words in err, err


def test_a_page_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    import errno
    from pathlib import Path

    root = samples_run(tmp_path, steps=1, groups=1, per_group=1)
    real = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(".viewer.html"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        prime_rl(["view", str(root)])
    assert exit_info.value.code != 0 and "no space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == ["metrics.jsonl", "rollouts"]



@pytest.fixture
def split_run(tmp_path, monkeypatch):
    """A run whose rollouts are over the one-file size (set to 0 MiB here): its page and step files."""
    from prime_rl.viewer import view

    monkeypatch.setattr(view, "ONE_FILE_MIB", 0)
    root = samples_run(tmp_path, steps=3, groups=2, per_group=2, text="<b>&</b>")
    return root, view.write_view(root, decode=lambda ids: {i: "x" for i in ids})


def test_a_large_runs_page_holds_no_rollout_and_each_step_is_a_file_beside_it(split_run):
    from prime_rl.run_dir import viewer_step_file, viewer_step_files
    from prime_rl.viewer.view import write_view

    root, page = split_run
    text = page.read_text()
    assert 'id="step-' not in text and '"step_files":"viewer_steps"' in text and "script-src 'sha256-" in text
    assert "'self'" in text.split("script-src", 1)[1].split(";", 1)[0]
    folder = viewer_step_files(page)
    assert sorted(p.name for p in folder.iterdir()) == ["step_0.js", "step_1.js", "step_2.js"]
    for step in range(3):
        script = viewer_step_file(folder, step).read_text()
        assert script.startswith(f"window.primeRlStep({step}, [") and script.endswith("]);\n")
        assert not set("<>&") & set(script), "a text could end the call or be read as markup"
    # --one-file embeds every step and takes the folder of the earlier write away
    write_view(root, one_file=True, decode=lambda ids: {i: "x" for i in ids})
    assert 'id="step-2"' in page.read_text() and "'self'" not in page.read_text() and not folder.exists()


def test_the_server_answers_the_page_and_its_step_files_and_nothing_else(split_run):
    import threading
    import urllib.error
    import urllib.request

    from prime_rl.viewer.view import page_server

    root, page = split_run
    server = page_server(page, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert urllib.request.urlopen(base + "/").read() == page.read_bytes()
        step = urllib.request.urlopen(base + "/viewer_steps/step_1.js")
        assert step.headers["Content-Type"].startswith("text/javascript")
        assert step.read().startswith(b"window.primeRlStep(1, ")
        for path in ("/viewer_steps/step_9.js", "/metrics.jsonl", "/viewer_steps/../metrics.jsonl",
                     "/viewer_steps/step_1.json", "/rollouts/step_0/samples.jsonl"):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(base + path)
            assert answer.value.code == 404, path
    finally:
        server.shutdown()
        server.server_close()


def test_the_server_finds_the_step_files_of_a_page_whose_name_is_escaped_in_urls(split_run):
    """The page asks for `encodeURIComponent(folder)/step_N.js`: a name with a space, `#`, `%` or a non-ASCII letter
    reaches the server escaped."""
    import threading
    import urllib.parse
    import urllib.request

    from prime_rl.viewer.view import page_server, write_view

    root, _ = split_run
    page = write_view(root, root / "my run #1 %41 é.html", decode=lambda ids: {i: "x" for i in ids})
    server = page_server(page, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        folder = urllib.parse.quote(page.stem + "_steps")
        assert urllib.request.urlopen(f"{base}/{folder}/step_2.js").read().startswith(b"window.primeRlStep(2, ")
        assert urllib.request.urlopen(f"{base}/?from=a-link").read() == page.read_bytes()
        assert urllib.request.urlopen(f"{base}/{urllib.parse.quote(page.name)}").read() == page.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("stranger", ["notes.txt", "step_1.json"])
def test_a_step_folder_that_holds_other_files_is_never_replaced(split_run, capsys, stranger):
    from prime_rl.run_dir import viewer_step_files

    root, page = split_run
    (viewer_step_files(page) / stranger).write_text("mine")
    before = page.read_text()
    with pytest.raises(SystemExit) as exit_info:
        prime_rl(["view", str(root), "--one-file"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "holds other files" in err, err
    assert (viewer_step_files(page) / stranger).read_text() == "mine" and page.read_text() == before
