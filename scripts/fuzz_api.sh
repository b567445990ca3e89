#!/usr/bin/env bash
# Fuzz the builtin inference server against its own OpenAPI document with schemathesis.
#
#   bash scripts/fuzz_api.sh                  # 300 cases per route; logs under outputs/fuzz_api/
#   EXAMPLES=1000 bash scripts/fuzz_api.sh
#
# It builds a tiny random model, starts `inference` on it (an API key, one allowed weight directory, a 128-token
# context), and runs schemathesis (pinned, in its own venv under outputs/fuzz_api/venv: it is a tool, not a
# dependency of prime-rl; the first run installs it, which needs the package index) with every check but
# `positive_data_acceptance`: a request can be schema-valid and still a 400, because no schema can say that
# prompt + max_tokens fits the context or prompts x n x max_tokens fits max_request_tokens (docs/inference.md,
# "API"). Passing means: no 5xx, every answer's status, content type and body as the document declares, every
# schema-violating request refused. Exit status: schemathesis's.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${FUZZ_DIR:-outputs/fuzz_api}
examples=${EXAMPLES:-300}
port=${PORT:-8765}
key=fuzz-key-$RANDOM$RANDOM
mkdir -p "$out/weights"
out=$(cd "$out" && pwd)  # absolute: schemathesis runs from there (it keeps a cache in its working directory)

if [ ! -x "$out/venv/bin/st" ]; then
    uv venv -q "$out/venv"
    VIRTUAL_ENV=$out/venv uv pip install -q "schemathesis==4.32.5"
fi
uv run python -c "from prime_rl.models.tiny_model import save_random_model; save_random_model('$out/model', seed=0)" \
    > "$out/model.log" 2>&1
PRIME_API_KEY=$key uv run inference --model.name "$out/model" --port "$port" --seq-len 128 \
    --weight-dirs "[\"$out/weights\"]" > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 $server 2>/dev/null || { echo "fuzz_api: the server exited: see $out/server.log" >&2; exit 1; }
    sleep 0.5
done
cd "$out"
"$out/venv/bin/st" run "http://127.0.0.1:$port/openapi.json" -H "Authorization: Bearer $key" \
    --checks all --exclude-checks positive_data_acceptance --max-examples "$examples" --workers 2 \
    --request-timeout 300 --max-response-time 300  # n = 1024 choices of up to 127 tokens take 20-40 s on a CPU
