"""How long one small request waits beside a flood of choices from another caller, on the builtin engine.

    uv run python benchmarks/fair_admission.py
    PYTHONPATH=<old checkout>/src uv run python benchmarks/fair_admission.py     # the engine before

One caller (one owner: the prompts of one HTTP request share it) asks for `--prompts` x `--n` choices of
`--max-tokens` tokens on a batch of `--batch`; 50 ms later another asks for one choice. Reports the small
request's wait, the flood's time, and the generations (batch-fulls of choices) the flood holds. A tiny random
model (hidden 64, 2 layers, the char tokenizer) on the CPU, one torch thread.
"""

from __future__ import annotations

import argparse
import inspect
import json
import tempfile
import time

from prime_rl.inference.builtin.engine import Engine, SamplingParams
from prime_rl.models.tiny_model import save_random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    model = save_random_model(tempfile.mkdtemp(), seed=0, hidden_size=64, num_layers=2)
    engine = Engine(str(model), context_len=256, seed=0, max_batch_size=args.batch, threads=1)
    owned = "owner" in inspect.signature(engine.submit).parameters  # the engine before had no owners
    flood_owner = object()

    def ids(text: str) -> list[int]:
        return engine.tokenizer(text, add_special_tokens=False)["input_ids"]

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1)
        start = time.monotonic()
        extra = {"owner": flood_owner} if owned else {}
        flood = [engine.submit(ids(f"flood {i}"), params, args.n, **extra) for i in range(args.prompts)]
        time.sleep(0.05)
        asked = time.monotonic()
        engine.submit(ids("innocent"), SamplingParams(max_tokens=args.max_tokens, seed=2)).result(timeout=3600)
        wait = time.monotonic() - asked
        for future in flood:
            future.result(timeout=3600)
        flood_s = time.monotonic() - start
    finally:
        engine.close()
    print(json.dumps({"fair_admission": owned, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                      "batch": args.batch, "generations": args.prompts * args.n / args.batch,
                      "innocent_wait_s": round(wait, 2), "flood_s": round(flood_s, 2)}))


if __name__ == "__main__":
    main()
