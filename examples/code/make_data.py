"""Writes train.jsonl and test.jsonl: string-transformation programs described in words, with stdin/stdout tests.

    python examples/code/make_data.py        # the files in this directory were written by exactly this

Each row: `prompt` ("Print input() after: reverse, upper"), `answer` (a reference program in a ```python fence, for
the SFT warm-up) and `input_output` (APPS's format, as a JSON string: {"inputs": [...], "outputs": [...]}), four
random strings of 4-8 mixed-case letters run through the steps in order. Test prompts are held out: no
(steps) combination of test.jsonl occurs in train.jsonl.
"""

import itertools
import json
import random
from pathlib import Path

STEPS = {  # name -> (how the program writes it around an expression e, what it does to a string)
    "reverse": ("{e}[::-1]", lambda s: s[::-1]),
    "upper": ("{e}.upper()", str.upper),
    "lower": ("{e}.lower()", str.lower),
    "swapcase": ("{e}.swapcase()", str.swapcase),
    "capitalize": ("{e}.capitalize()", str.capitalize),
    "sort": ("''.join(sorted({e}))", lambda s: "".join(sorted(s))),
    "first 3": ("{e}[:3]", lambda s: s[:3]),
    "last 3": ("{e}[-3:]", lambda s: s[-3:]),
    "drop first": ("{e}[1:]", lambda s: s[1:]),
    "drop last": ("{e}[:-1]", lambda s: s[:-1]),
}
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def row(steps: tuple[str, ...], rng: random.Random) -> dict:
    expression = "input()"
    for step in steps:
        expression = STEPS[step][0].format(e=expression)
    inputs = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 8))) for _ in range(4)]
    outputs = []
    for text in inputs:
        for step in steps:
            text = STEPS[step][1](text)
        outputs.append(text + "\n")
    return {"prompt": f"Print input() after: {', '.join(steps)}",
            "answer": f"```python\nprint({expression})\n```",
            "input_output": json.dumps({"inputs": [i + "\n" for i in inputs], "outputs": outputs})}


def main() -> None:
    rng = random.Random(0)
    combos = [c for n in (1, 2, 3) for c in itertools.permutations(STEPS, n)]
    rng.shuffle(combos)
    held_out = set(combos[:200])
    train_combos = [c for c in combos if c not in held_out]
    here = Path(__file__).parent
    with open(here / "train.jsonl", "w") as f:
        for _ in range(4000):
            f.write(json.dumps(row(rng.choice(train_combos), rng)) + "\n")
    with open(here / "test.jsonl", "w") as f:
        for combo in sorted(held_out):
            f.write(json.dumps(row(combo, rng)) + "\n")


if __name__ == "__main__":
    main()
