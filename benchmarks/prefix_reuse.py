"""Prefix reuse in the builtin engine: a multi-turn conversation's generation time with each turn prefilled only
past the conversation so far (`inference.builtin.prefix_cache_mib`) against a full prefill of every turn.

    uv run python benchmarks/prefix_reuse.py [--turns 6] [--conversations 16] [--user-chars 200]
                                             [--max-tokens 32] [--repeats 3] [--hidden 128] [--layers 4]

Builds a random tiny Qwen3 with the character tokenizer (the embedded model's shape by default: hidden 128 x 4
layers; one token per character), then runs `--conversations` conversations at once, `--turns` turns each, token
in, token out as a multi-turn rollout or an agent session does: each turn's prompt is the previous prompt, the
sampled ids, and the template tail of a new user message of `--user-chars` characters. The same seeds under both
settings, alternated `--repeats` times (each the median reported), one engine thread (the project's default).
Reports the wall time of all turns, the tokens prefilled, and that both settings sampled the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from prime_rl.chat.template_tokens import ChatTokens  # noqa: E402
from prime_rl.inference.builtin.engine import Engine, SamplingParams  # noqa: E402
from prime_rl.models.tiny_model import save_random_model  # noqa: E402


def run(engine: Engine, chat: ChatTokens, args) -> tuple[float, int, list[list[int]]]:
    """(seconds, prompt tokens prefilled, every turn's sampled ids) of the conversations."""
    letters = "abcdefghijklmnopqrstuvwxyz "
    histories = [[{"role": "user", "content": (letters * 50)[i:i + args.user_chars]}]
                 for i in range(args.conversations)]
    prompts = [chat.prompt_ids(h, []) for h in histories]
    sampled, prefilled = [], 0
    saved_before = engine.prefixes.saved_tokens
    start = time.perf_counter()
    for turn in range(args.turns):
        futures = [engine.submit(p, SamplingParams(max_tokens=args.max_tokens, seed=1000 * turn + i))
                   for i, p in enumerate(prompts)]
        completions = [f.result(timeout=600)[0] for f in futures]
        prefilled += sum(map(len, prompts))
        sampled += [c.token_ids for c in completions]
        for i, completion in enumerate(completions):
            histories[i].append({"role": "assistant", "content": completion.text})
            reply = [{"role": "user", "content": (letters * 50)[turn:turn + args.user_chars]}]
            prompts[i] = prompts[i] + completion.token_ids + chat.reply_ids(histories[i], reply, [],
                                                                           completion.token_ids[-1])
            histories[i] += reply
    seconds = time.perf_counter() - start
    return seconds, prefilled - (engine.prefixes.saved_tokens - saved_before), sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--user-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = save_random_model(Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers,
                                  max_position_embeddings=8192)
        chat = ChatTokens.load(str(model))
        engines = {"full prefill": Engine(str(model), context_len=8192, max_batch_size=256, threads=1),
                   "prefix reuse": Engine(str(model), context_len=8192, max_batch_size=256, threads=1,
                                          prefix_cache_mib=512)}
        times: dict[str, list[float]] = {name: [] for name in engines}
        results = {}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                engine.prefixes.clear()
                seconds, prefilled, sampled = run(engine, chat, args)
                times[name].append(seconds)
                results[name] = (prefilled, sampled)
        for engine in engines.values():
            engine.close()
    print(f"{args.conversations} conversations x {args.turns} turns, {args.user_chars}-char user turns, "
          f"{args.max_tokens} sampled tokens at most per turn, hidden {args.hidden} x {args.layers} layers")
    for name in engines:
        prefilled, _ = results[name]
        print(f"  {name:13s} {statistics.median(times[name]):7.2f} s (median of {args.repeats}: "
              f"{', '.join(f'{t:.2f}' for t in times[name])}), {prefilled} prompt tokens prefilled")
    same = results["full prefill"][1] == results["prefix reuse"][1]
    speedup = statistics.median(times["full prefill"]) / statistics.median(times["prefix reuse"])
    print(f"  speed-up {speedup:.2f}x; the same sampled tokens under both: {same}")


if __name__ == "__main__":
    main()
