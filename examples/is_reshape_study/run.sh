#!/usr/bin/env bash
# The IS-reshape study (README.md): vanilla (no clip), clipped PPO and is_reshape on reverse-text,
# 16 update epochs per batch, same seed; then analyze.py writes results.md and kl_reward.png here.
#
#   bash examples/is_reshape_study/run.sh
#
# Runs into outputs/is_reshape_study/<name> (replacing an earlier run there: --overwrite).
set -euo pipefail
cd "$(dirname "$0")/../.."
study=examples/is_reshape_study
start=$(date +%s)
echo "load before: $(uptime)"
for name in vanilla clip is_reshape; do
    t0=$(date +%s)
    uv run rl @ "$study/$name.toml" --overwrite
    echo "== $name: $(( $(date +%s) - t0 )) s"
done
t0=$(date +%s)
uv run python "$study/analyze.py" --runs-root outputs/is_reshape_study --out "$study"
echo "== analysis: $(( $(date +%s) - t0 )) s"
echo "load after: $(uptime)"
echo "total wall time: $(( $(date +%s) - start )) s"
