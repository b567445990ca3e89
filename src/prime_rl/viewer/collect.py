"""What the viewer shows of a run, read from its directory: every step's `samples.jsonl` joined with the trainer's
`token_outcomes_rank_R.jsonl` by sample key, the reward curve, and the text of each token id that occurs.

A token's text is the run's tokenizer decoding that id as it reads inside a text (`token_texts`; a piece of a
multi-byte character shows as U+FFFD); when the tokenizer cannot be loaded here the page shows ids (`#123`) and says
why.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prime_rl.run_dir import config_file, rollout_dir, rollouts_root, samples_file, token_outcomes_files
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import list_steps


@dataclass
class RunSamples:
    """A run's samples as the page embeds them."""

    name: str
    steps: dict[int, list[dict[str, Any]]]  # step -> its rollout lines, tokens joined with the trainer's outcomes
    left_out: dict[int, int]  # step -> rollouts its samples.jsonl left out (`max_mib`)
    vocab: dict[int, str] = field(default_factory=dict)  # token id -> text, for every id the samples hold
    notes: list[str] = field(default_factory=list)  # what the page could not show, one line each


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON lines of `path` (bytes that are not UTF-8 read as U+FFFD; a line cut by a killed writer is skipped:
    the writers rename whole files into place, so only a copy made by hand can hold one)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def step_samples(directory: Path) -> tuple[list[dict[str, Any]], int]:
    """One rollout step directory's rollout lines, each training sample's token record joined with the trainer's
    record of the same key (`trainer_logprobs`, `outcomes`), and how many rollouts its file left out."""
    outcomes: dict[int, dict[str, Any]] = {}
    for path in token_outcomes_files(directory):
        outcomes |= {record["key"]: record for record in read_lines(path)}
    rollouts, left_out = [], 0
    for record in read_lines(samples_file(directory)):
        if "left_out" in record:
            left_out += int(record["left_out"])
            continue
        record["env"] = str(record.get("env"))  # one name to show and filter by, whatever the file holds
        for tokens in record.get("tokens") or []:
            trainer = outcomes.get(tokens.get("key"))
            if trainer is not None:
                tokens["trainer_logprobs"], tokens["outcomes"] = trainer["logprobs"], trainer["outcomes"]
        rollouts.append(record)
    return rollouts, left_out


def collect(run_dir: Path, steps: range | None = None,
            decode: Callable[[list[int]], dict[int, str]] | None = None) -> RunSamples:
    """The samples of `run_dir` (every step that wrote some, or those in `steps`); token texts from `decode`
    (ids -> texts; default: the run's own tokenizer, `run_decoder`)."""
    run_dir = Path(run_dir)
    if not rollouts_root(run_dir).is_dir():
        raise UserError(f"{run_dir} is not a run directory with rollouts (no {rollouts_root(run_dir).name}/ in it)")
    run = RunSamples(run_dir.resolve().name, {}, {})
    for step in list_steps(rollouts_root(run_dir)):
        directory = rollout_dir(run_dir, step)
        if (steps is None or step in steps) and samples_file(directory).is_file():
            run.steps[step], left_out = step_samples(directory)
            if left_out:
                run.left_out[step] = left_out
    if not run.steps and steps is not None:
        raise UserError(f"no step of {run_dir} in the --steps range wrote samples")
    if not run.steps:
        raise UserError(f"{run_dir} holds no samples.jsonl: the run wrote none ([orchestrator.samples] interval = 0?)")
    ids = sorted({i for rows in run.steps.values() for row in rows for t in row.get("tokens") or [] for i in t["ids"]})
    if decode is None:
        decode, note = run_decoder(run_dir)
        run.notes += [note] if note else []
    run.vocab = decode(ids)
    return run


def run_decoder(run_dir: Path) -> tuple[Callable[[list[int]], dict[int, str]], str | None]:
    """Token ids -> texts with the tokenizer of the run's trainer config (`configs/trainer.toml`), or ids shown as
    `#id` and the one line that says why."""
    try:
        tokenizer = run_tokenizer(run_dir)
    except (OSError, ValueError, KeyError, UserError, tomllib.TOMLDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (lambda ids: {i: f"#{i}" for i in ids}), f"tokens are shown as ids: no tokenizer ({reason})"
    return (lambda ids: token_texts(tokenizer, ids)), None


def token_texts(tokenizer, ids: list[int]) -> dict[int, str]:
    """Each id's text as it reads inside a text: decoded after an anchor token, the anchor's own text cut off, so a
    tokenizer that drops a word's leading space at the start of a text (SentencePiece's) keeps it here."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
    prefix = tokenizer.decode(anchor) if anchor else ""
    texts = {}
    for i in ids:
        text = tokenizer.decode(anchor + [i]) if anchor else tokenizer.decode([i])
        texts[i] = text[len(prefix):] if prefix and text.startswith(prefix) else tokenizer.decode([i])
    return texts


def run_tokenizer(run_dir: Path):
    """The tokenizer of the run's trainer (its `[model]` in `configs/trainer.toml`)."""
    from prime_rl.configs.shared import ModelConfig
    from prime_rl.trainer.model import load_tokenizer

    path = config_file(run_dir, "trainer")
    if not path.is_file():
        raise UserError(f"{path} is missing")
    return load_tokenizer(ModelConfig(**tomllib.loads(path.read_text())["model"]))
