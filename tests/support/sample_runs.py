"""Run directories holding samples as a run writes them, made without running: for the viewer's tests at sizes and
with texts a real run would take long to produce (`samples_run`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from prime_rl.run_dir import rollout_dir, samples_file, token_outcomes_file

ENVS = ("reverse-text", "calculator")


def rollout_line(step: int, group: int, rollout: int, rng: random.Random, text: str | None = None,
                 tokens: int = 40) -> dict:
    """One samples.jsonl line with `tokens` completion tokens (ids 4..60) and a key of group * 64 + rollout."""
    reward = round(rng.random(), 3)
    completion = text if text is not None else "".join(chr(97 + rng.randrange(26)) for _ in range(tokens))
    return {"step": step, "env": ENVS[group % 2], "group": group, "rollout": rollout, "kept": group % 4 != 3,
            "prompt": [{"role": "user", "content": f"prompt of group {group}"}], "answer": "abc",
            "messages": [{"role": "assistant", "content": completion}], "completion": completion,
            "reward": reward, "components": {"lcs": reward}, "advantage": None if group % 4 == 3 else reward - 0.5,
            "error": "the environment raised KeyError" if rollout == 5 else None, "finish_reason": "stop",
            "truncated": False, "prompt_tokens": 12, "completion_tokens": tokens, "sampled_tokens": tokens,
            "turns": 1, "tool_calls": 0, "segments": 1, "policy_lag": 0,
            "tokens": [{"key": group * 64 + rollout, "ids": [4 + rng.randrange(56) for _ in range(tokens)],
                        "logprobs": [round(-rng.random() * 4, 5) for _ in range(tokens)], "sampled": [True] * tokens,
                        "weight_steps": [step] * tokens}]}


def samples_run(root: Path, steps: int, groups: int, per_group: int, tokens: int = 40, seed: int = 0,
                text: str | None = None) -> Path:
    """A run directory of `steps` steps of `groups` x `per_group` rollouts (each completion `text` if given), each step
    with a trainer record of its kept samples (logprobs near the sampler's, an outcome mix), and a metrics.jsonl reward
    curve."""
    rng = random.Random(seed)
    with open(root / "metrics.jsonl", "w") as metrics:
        for step in range(steps):
            directory = rollout_dir(root, step)
            directory.mkdir(parents=True)
            lines = [rollout_line(step, g, r, rng, text, tokens) for g in range(groups) for r in range(per_group)]
            samples_file(directory).write_text("".join(json.dumps(line) + "\n" for line in lines))
            with open(token_outcomes_file(directory, 0), "w") as f:
                for line in lines:
                    if line["kept"]:
                        record = line["tokens"][0]
                        logprobs = [round(lp + rng.gauss(0, 0.05), 5) for lp in record["logprobs"]]
                        outcomes = "".join(rng.choice("kkkkkkklhxr") for _ in record["ids"])
                        f.write(json.dumps({"key": record["key"], "logprobs": logprobs, "outcomes": outcomes}) + "\n")
            mean = sum(line["reward"] for line in lines) / len(lines)
            metrics.write(json.dumps({"step": step, "source": "orchestrator", "reward/mean": mean}) + "\n")
    return root
