#!/usr/bin/env bash
# Rebuild an embedded model (src/prime_rl/assets/<name>) from nothing but this project's own
# code: `sft` on an environment's demonstrations, with the example's sft.toml.
#
#   bash scripts/build_tiny_model.sh                      # tiny-reverse-text (~30 s on 2 CPU cores)
#   bash scripts/build_tiny_model.sh tiny-calculator      # ~3 min
#   bash scripts/build_tiny_model.sh tiny-multi-turn      # ~2 min; starts from tiny-reverse-text
#
# | name              | config                          | step | from                           |
# | tiny-reverse-text | examples/reverse_text/sft.toml  |   60 | random init, char tokenizer    |
# | tiny-calculator   | examples/tool_use/sft.toml      |  275 | random init, char tokenizer    |
# | tiny-multi-turn   | examples/multi_turn/sft.toml    |   60 | the embedded tiny-reverse-text |
#
# Each shipped step is deliberately short of what SFT can reach: the model answers well
# greedily but not when sampling, the gap its RL example closes (see the example's README).
# STEP=N overrides the step.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-tiny-reverse-text}
case "$name" in
    tiny-reverse-text) config=examples/reverse_text/sft.toml; default_step=60 ;;
    tiny-calculator) config=examples/tool_use/sft.toml; default_step=275 ;;
    tiny-multi-turn) config=examples/multi_turn/sft.toml; default_step=60 ;;
    *) echo "error: unknown embedded model '$name' (tiny-reverse-text, tiny-calculator, tiny-multi-turn)" >&2; exit 2 ;;
esac
step=${STEP:-$default_step}
build_dir=outputs/$name-build
target=src/prime_rl/assets/$name

rm -rf "$build_dir"
uv run sft @ "$config" --output-dir "$build_dir" --max-steps "$step" --wandb.mode disabled
src="$build_dir/weights/step_$step"
[ -f "$src/config.json" ] || { echo "error: $src was not written" >&2; exit 1; }

rm -rf "$target.tmp" && cp -r "$src" "$target.tmp" && chmod -R u=rwX,go=rX "$target.tmp"
rm -rf "$target" && mv "$target.tmp" "$target"
echo "embedded model rebuilt: $target ($(du -sh "$target" | cut -f1)) from $src"
