"""Every data format (JSONL, JSON, CSV, parquet, a directory of them, a `datasets` save_to_disk directory, a
cached data set name) gives the same rows; unreadable sources are one line naming the file and row."""

from __future__ import annotations

import csv
import json

import pytest

from prime_rl.envs.data_files import load_rows
from prime_rl.utils.errors import UserError

ROWS = [{"question": f"what is {i} + {i}?", "answer": str(2 * i), "level": str(i % 3)} for i in range(25)]


def write_all_formats(root):
    """The same rows as .jsonl, .json, .csv, .parquet, a directory of split files and a save_to_disk directory."""
    import datasets

    root.mkdir(parents=True, exist_ok=True)
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "d.json").write_text(json.dumps(ROWS))
    with (root / "d.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    data = datasets.Dataset.from_list(ROWS)
    data.to_parquet(str(root / "d.parquet"))
    (root / "shards").mkdir()
    data.select(range(10)).to_parquet(str(root / "shards" / "train-00000-of-00002.parquet"))
    data.select(range(10, 25)).to_parquet(str(root / "shards" / "train-00001-of-00002.parquet"))
    data.select(range(3)).to_parquet(str(root / "shards" / "test-00000-of-00001.parquet"))
    datasets.DatasetDict({"train": data, "test": data.select(range(3))}).save_to_disk(str(root / "saved"))
    return root


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    return write_all_formats(tmp_path_factory.mktemp("formats"))


@pytest.mark.parametrize("source", ["d.jsonl", "d.json", "d.csv", "d.parquet", "shards", "saved"])
@pytest.mark.slow
def test_every_format_and_directory_loads_the_same_rows(formats, source):
    rows = [row for row, _ in load_rows(formats / source)]
    assert rows == ROWS


@pytest.mark.parametrize("source", ["shards", "saved"])
def test_a_directory_gives_the_split_asked_for(formats, source):
    assert [row for row, _ in load_rows(formats / source, "test")] == ROWS[:3]
    with pytest.raises(UserError, match="validation"):
        load_rows(formats / source, "validation")


def test_a_data_set_name_that_is_not_cached_is_one_line_and_never_downloaded(formats, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    with pytest.raises(UserError) as info:
        load_rows("some-org/not-in-any-cache", "train")
    assert "nothing is downloaded at run time" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("content", "name", "message"), [
    ("", "empty.jsonl", "has no rows"),
    ('{"a": 1}\n[1, 2]\n', "list.jsonl", "list.jsonl:2: a row must be a JSON object"),
    ('{"a": 1}\n{"a": \n', "broken.jsonl", "broken.jsonl:2: not valid JSON"),
    ('{"a": 1}', "object.json", "must hold a list of objects"),
    ("a,b\n", "header.csv", "has no rows"),
    ("x", "data.txt", "unknown format .txt"),
])
def test_unreadable_sources_are_one_line_naming_the_file_and_row(tmp_path, content, name, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        load_rows(path)
    assert "\n" not in str(info.value)
