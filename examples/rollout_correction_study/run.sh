#!/usr/bin/env bash
# The rollout-correction study (README.md): seven objectives on reverse-text, 2 update epochs per batch, at
# max_async_level 2 and 4, same seed; then analyze.py writes results.md and reward.png here.
#
#   bash examples/rollout_correction_study/run.sh
#
# Runs into outputs/rollout_correction_study/async<k>/<name> (replacing an earlier run there: --overwrite).
set -euo pipefail
cd "$(dirname "$0")/../.."
study=examples/rollout_correction_study
root=outputs/rollout_correction_study
start=$(date +%s)
echo "load before: $(uptime)"
for k in 2 4; do
    for name in default grpo tis icepop geo_rs decoupled_ppo dppo; do
        t0=$(date +%s)
        uv run rl @ "$study/$name.toml" --max-async-level "$k" --output-dir "$root/async$k/$name" --overwrite
        echo "== async$k/$name: $(( $(date +%s) - t0 )) s"
    done
done
t0=$(date +%s)
uv run python "$study/analyze.py" --runs-root "$root" --out "$study"
echo "== analysis: $(( $(date +%s) - t0 )) s"
echo "load after: $(uptime)"
echo "total wall time: $(( $(date +%s) - start )) s"
