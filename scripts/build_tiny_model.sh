#!/usr/bin/env bash
# Rebuild the embedded `tiny-reverse-text` model (src/prime_rl/assets/tiny-reverse-text)
# from nothing but this project's own code: `sft` from a random-init Qwen3 config with
# the built-in character-level tokenizer, on generated reverse-text examples.
#
#   bash scripts/build_tiny_model.sh            # ~30 s on 2 CPU cores
#
# The shipped checkpoint is step 60 of examples/reverse_text/sft.toml: reward ~0.85 with
# greedy decoding but ~0.38 sampled at T=1. That gap is what RL closes; a few more SFT
# steps (greedy ~0.95 by step 70) would leave the RL examples little to learn.
set -euo pipefail
cd "$(dirname "$0")/.."

step=${STEP:-60}
build_dir=outputs/tiny-reverse-text-build
target=src/prime_rl/assets/tiny-reverse-text

rm -rf "$build_dir"
uv run sft @ examples/reverse_text/sft.toml --output-dir "$build_dir" \
    --max-steps "$step" --wandb.mode disabled
src="$build_dir/weights/step_$step"
[ -f "$src/config.json" ] || { echo "error: $src was not written" >&2; exit 1; }

rm -rf "$target.tmp" && cp -r "$src" "$target.tmp"
rm -rf "$target" && mv "$target.tmp" "$target"
echo "embedded model rebuilt: $target ($(du -sh "$target" | cut -f1)) from $src"
