"""`eval`: evaluate a model on an rl config's environments, with no training.

    uv run eval @ examples/smollm2/rl.toml                 # the config's model before training
    uv run eval @ examples/smollm2/rl.toml --step 30       # the model + its output_dir/weights/step_30
    uv run eval --model.name <dir> --orchestrator.env '[{id = "reverse-text"}]'

The held-out set is the one `[orchestrator.eval]` scores during a run (its first `num_examples` eval examples
per environment, the same every time): the numbers here are a run's `eval/<env>/...` at the same weights. One
greedy pass gives, per environment, `accuracy` (the fraction of examples whose reward reaches
`orchestrator.eval.success_threshold`), `reward` (the mean) and `tokens` (the mean completion length, in tokens);
with `orchestrator.eval.rollouts = k > 1` a second pass samples k completions per example at
`orchestrator.eval.temperature` for `pass@k` (the fraction with at least one success) and `sampled_reward`. (With
one rollout the first pass runs at `orchestrator.eval.temperature`, greedy by default, as the run's evaluation does.)

`--step N` serves the config's model and loads the run's `weights/step_N` into it as the run's server did (full
weights, or a LoRA adapter merged into the base). The model is served by a builtin engine in this process
(`evaluation/held_out.py`: on a free loopback port, the config's `[inference]` options); the table goes to stdout,
the same figures to a JSON file (`output`, by default `<output_dir>/eval/<base|step_N>.json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

from pydantic import Field

from prime_rl.configs.base import with_values
from prime_rl.configs.cli import run_main
from prime_rl.evaluation.held_out import score
from prime_rl.launch.rl_config import RLConfig
from prime_rl.models.lora_adapter import ADAPTER_CONFIG
from prime_rl.run_dir import TRANSFER_MARKER, eval_file, weights_dir, weights_root
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import atomic_write_text, list_steps


class EvalCommandConfig(RLConfig):
    """eval: score a model on the held-out examples of an rl config's environments (no training)."""

    command = "eval"

    step: Annotated[int, Field(ge=0)] | None = None
    """Evaluate the weights an rl run published at this step (`<output_dir>/weights/step_N`); none: `model.name`."""
    output: Path | None = None
    """JSON file of the results; none: `<output_dir>/eval/<base|step_N>.json`. Checked before anything is scored."""


def render(model: str, results: dict[str, dict[str, float]]) -> str:
    """The results as an aligned text table, one row per environment."""
    columns = list(dict.fromkeys(k for row in results.values() for k in row))
    rows = [["env", *columns]] + [[env, *(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                                          for c in columns)] for env, row in results.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([f"model: {model}", *lines])


def output_file(config: EvalCommandConfig) -> Path:
    """Where the JSON goes (checked before anything is scored): not a directory, in a writable directory."""
    output = config.output or eval_file(config.output_dir, config.step)
    if output.is_dir() or not output.name:
        raise UserError(f"output {str(output)!r} is a directory: name a JSON file")
    parent = output.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output {output}: {parent} is not writable")
    return output


def step_weights(config: EvalCommandConfig) -> Path:
    """`weights/step_N` of the run, or a one-line error naming the steps it kept."""
    path = weights_dir(config.output_dir, config.step)
    if (path / TRANSFER_MARKER).is_file():
        raise UserError(f"--step {config.step}: {path} has no weights: the run sent them over its transfer group "
                        "(weight_transfer.mode = \"distributed\")")
    if not any((path / name).is_file() for name in ("config.json", ADAPTER_CONFIG)):
        kept = list_steps(weights_root(config.output_dir))
        raise UserError(f"--step {config.step}: no weights at {path} (kept: "
                        f"{', '.join(map(str, kept)) or 'none'}; the run keeps its newest trainer.keep_weights, "
                        "3 by default: set it to none to keep all)")
    return path


def evaluate(config: EvalCommandConfig) -> dict:
    """Serve, score, print, write the JSON (module docstring); returns what it wrote."""
    if "backend" in config.inference.model_fields_set and config.inference.backend == "vllm":
        raise UserError("eval serves with the builtin engine: drop --inference.backend vllm (or give builtin)")
    if config.judge is not None:
        raise UserError("eval starts no judge server: give the judge reward its base_url "
                        "(reward_options.judge.base_url) and leave out [judge]")
    output = output_file(config)
    weights = None
    # The builtin engine on loopback, whatever the config's server would be (an eval serves nobody else).
    values: dict = {"inference.backend": "builtin", "inference.host": "127.0.0.1", "inference.port": 0}
    if config.step is not None:  # served as a run serves it: the base model, then the step's weights loaded
        weights = (step_weights(config), config.step)
        values["inference.weight_dirs"] = [*config.inference.weight_dirs, weights_root(config.output_dir).absolute()]
    config = with_values(config, values).derived()
    results = score(config.inference, config.orchestrator, weights)
    model = config.model.name if weights is None else f"{config.model.name} + {weights[0]}"
    report = {"model": model, "step": config.step, "seed": config.orchestrator.seed, "results": results}
    print(render(model, results))
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, json.dumps(report, indent=1) + "\n")
    print(f"written: {output}")
    return report


def main(argv: list[str] | None = None) -> None:
    run_main(EvalCommandConfig, evaluate, argv)


if __name__ == "__main__":
    main()
