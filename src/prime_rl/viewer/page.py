"""The viewer's page: an HTML file that opens from the file system with no network (no CDN, no request of any
kind: its Content-Security-Policy allows nothing but its own script and style, by hash, and, for a large run, the
step files beside it).

A short run's data is embedded as JSON in `<script type="application/json">` blocks, one per step (parsed when the
step is opened): the page is one file. A large run's page holds the run's summary alone (steps, reward curve, token
texts) and each step's rollouts are a file beside it, `<page>_steps/step_N.js` = `window.primeRlStep(N, <json>);`
(`step_script`), loaded when the step is opened, so the page stays small however long the run. Either way every `<`,
`>` and `&` of the JSON is written as a \\u escape and every non-ASCII character too: no text of a completion can end
a block or be read as markup or code, and bytes that were not UTF-8 arrive as U+FFFD. The script
(`assets/viewer.js`) puts text on the page with `textContent` only.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from importlib.resources import files
from pathlib import Path
from typing import Any

from prime_rl.run_dir import metrics_file
from prime_rl.run_report import MetricsTail
from prime_rl.viewer.collect import RunSamples

ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


def json_block(value: Any) -> str:
    """`value` as JSON safe inside a script element (module docstring); a NaN or infinity (files of older versions
    could hold one) becomes null, which the browser's JSON.parse accepts."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    if "NaN" in text or "Infinity" in text:  # rare: then the slow pass (the words may also be in a text)
        text = json.dumps(finite(value), ensure_ascii=True, separators=(",", ":"), default=str, allow_nan=False)
    return text.translate(ESCAPES)


def finite(value: Any) -> Any:
    """`value` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def asset(name: str) -> str:
    return files("prime_rl.viewer").joinpath("assets", name).read_text(encoding="utf-8")


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def reward_curve(run_dir: Path, run: RunSamples) -> list[list[float | None]]:
    """[step, mean reward] per step: the orchestrator's `reward/mean` from metrics.jsonl (every scored rollout of
    the step), else the mean of the step's written rollouts."""
    tail = MetricsTail(metrics_file(run_dir))
    tail.poll()
    logged = tail.get("orchestrator", "reward/mean")
    curve = []
    for step, rows in sorted(run.steps.items()):
        rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), int | float)]
        curve.append([step, logged.get(step, sum(rewards) / len(rewards) if rewards else None)])
    return curve


def step_script(step: int, rows: list[dict[str, Any]]) -> str:
    """A step file's text: one call of the page's `primeRlStep` with the step's rollouts (JSON, escaped as in the
    page: JSON is an expression of JavaScript, and no character of it can end the call)."""
    return f"window.primeRlStep({int(step)}, {json_block(rows)});\n"


def render_page(run_dir: Path, run: RunSamples, step_files: str | None = None) -> str:
    """The whole page of `run` (read from `run_dir`): the steps embedded, or with `step_files` (the folder's name
    beside the page) loaded from there."""
    script, style = asset("viewer.js"), asset("viewer.css")
    meta = {"name": run.name, "steps": sorted(run.steps), "curve": reward_curve(run_dir, run),
            "envs": sorted({r["env"] for rows in run.steps.values() for r in rows}),
            "vocab": {str(k): v for k, v in run.vocab.items()}, "notes": run.notes,
            "left_out": {str(k): v for k, v in run.left_out.items()}, "step_files": step_files}
    scripts = csp_hash(script) + (" 'self'" if step_files else "")
    policy = f"default-src 'none'; script-src {scripts}; style-src {csp_hash(style)}; img-src data:"
    steps = "" if step_files else "\n".join(
        f'<script type="application/json" id="step-{step}">{json_block(rows)}</script>'
        for step, rows in sorted(run.steps.items()))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>rollouts of {html.escape(run.name)}</title>\n<style>{style}</style>\n</head><body>\n'
            f'<div id="app"></div>\n'
            f'<script type="application/json" id="run-meta">{json_block(meta)}</script>\n{steps}\n'
            f'<script>{script}</script>\n</body></html>\n')
