#!/usr/bin/env bash
# Every GPU check of this project in one go, where a CUDA device exists; on a machine without one it
# says so in one line and exits 0 (the normal suite collects the same `gpu` tests and skips them).
#
#   bash scripts/gpu_check.sh                 # logs and the rl run under outputs/gpu_check/
#
# What runs (each its own log; a summary at the end; exit 1 if any failed):
#   gpu-tests     pytest -m gpu: the trainer in bf16 under FSDP2 (NCCL), the builtin engine on CUDA,
#                 flash-attention's packed layout against sdpa, the weight transfer over NCCL (2 GPUs)
#                 (tests/test_gpu.py)
#   vllm-tests    pytest -k vllm: the vLLM backend's logprobs against the trainer's, adapters, the teacher
#                 (only where vllm is installed; SKIP otherwise)
#   trainer-0.5b  benchmarks/trainer.py --preset 0.5b: tokens/s and MFU of the trainer step (a ~0.6B Qwen3)
#   rl-example    rl @ examples/reverse_text/rl.toml for 20 steps on the GPU(s)
# How to read the figures: docs/benchmarks.md ("GPU check").
#
# PYTHON overrides the interpreter (default: uv run python).
set -uo pipefail
cd "$(dirname "$0")/.."
read -r -a python <<< "${PYTHON:-uv run python}"

if ! "${python[@]}" -c "import torch" 2>/dev/null; then
    echo "gpu_check: cannot import torch with ${python[*]} (set PYTHON, or run uv sync)" >&2
    exit 1
fi
if ! "${python[@]}" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible here: nothing to check (the gpu tests are skipped in the normal suite)"
    exit 0
fi

logs=${GPU_CHECK_DIR:-outputs/gpu_check}
mkdir -p "$logs"
summary=()
failed=0

check() {  # check NAME COMMAND...: run it, log it, time it
    local name=$1 start status
    shift
    start=$(date +%s)
    if "$@" > "$logs/$name.log" 2>&1; then status=PASS; else status=FAIL; failed=1; fi
    summary+=("$status  $name  $(( $(date +%s) - start )) s  ($logs/$name.log)")
}

check gpu-tests "${python[@]}" -m pytest -n 0 -m gpu -q  # -n 0: one process on the GPU at a time
if "${python[@]}" -c "import vllm" 2>/dev/null; then
    check vllm-tests "${python[@]}" -m pytest -n 0 -q -k vllm tests
else
    summary+=("SKIP  vllm-tests  (vllm is not installed)")
fi
check trainer-0.5b "${python[@]}" benchmarks/trainer.py --preset 0.5b --steps 4
check rl-example "${python[@]}" -m prime_rl.launch.rl @ examples/reverse_text/rl.toml --max-steps 20 \
    --output-dir "$logs/rl" --overwrite

echo "gpu_check on $("${python[@]}" -c "import torch; print(torch.cuda.get_device_name(0))"):"
printf '  %s\n' "${summary[@]}"
grep -h '"tokens_per_s"' "$logs/trainer-0.5b.log" 2>/dev/null | tail -1 | sed 's/^/  trainer-0.5b: /'
grep -h '^reward:' "$logs/rl-example.log" 2>/dev/null | tail -1 | sed 's/^/  rl-example: /'
exit $failed
