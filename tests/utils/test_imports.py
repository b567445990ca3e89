"""`import_object`: user code named in a config, by module name or by Python file (`utils/imports.py`)."""

from __future__ import annotations

import pytest

from prime_rl.utils.imports import import_object


def test_a_python_file_relative_to_the_working_directory_is_imported_once(tmp_path, monkeypatch):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "solve.py").write_text("CALLS = []\nCALLS.append(1)\ndef run():\n    return 'a'\n")
    monkeypatch.chdir(tmp_path)
    run = import_object("agents/solve.py:run")
    assert run() == "a" and import_object(f"{tmp_path}/agents/solve.py:run") is run
    assert import_object("agents/solve.py:CALLS") == [1]  # imported once


def test_two_files_of_one_name_stay_apart(tmp_path):
    for folder, value in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "tools.py").write_text(f"VALUE = {value}\n")
    assert import_object(f"{tmp_path}/a/tools.py:VALUE") == 1 and import_object(f"{tmp_path}/b/tools.py:VALUE") == 2


@pytest.mark.parametrize("body, path, message", [
    (None, "missing.py:run", "no such file"),
    ("raise RuntimeError('at import')\n", "broken.py:run", "at import"),
    ("x = 1\n", "plain.py:run", "has no 'run'"),
])
def test_a_file_that_cannot_give_the_name_is_one_error_naming_it(tmp_path, body, path, message):
    if body is not None:
        (tmp_path / path.split(":")[0]).write_text(body)
    with pytest.raises(ValueError, match=message):
        import_object(f"{tmp_path}/{path}")
    if path.startswith("broken"):  # a module that failed to import is not kept: the fixed file imports
        (tmp_path / "broken.py").write_text("def run():\n    return 1\n")
        assert import_object(f"{tmp_path}/{path}")() == 1
