"""Models shipped inside the package, addressed by a short name in `model.name`.

`tiny-reverse-text` is a 0.8M-parameter Qwen3 with a character-level tokenizer, built
from random init by this project's own `sft` on reverse-text examples
(`scripts/build_tiny_model.sh` rebuilds it); `tiny-calculator` is the same architecture
SFT'd on the `calculator` tool-use environment, `tiny-multi-turn` is `tiny-reverse-text`
SFT'd on the second turn of `reverse-text-hint` (`scripts/build_tiny_model.sh <name>`). Any
other name is passed through unchanged to Hugging Face (`from_pretrained` of a local
directory or a hub name).
"""

from __future__ import annotations

from pathlib import Path

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
        if looks_like_local_path(name) and not Path(name).expanduser().exists():
            raise UserError(f"model.name {name!r}: no such directory (a hub name is 'org/model'; a local path "
                            f"must exist, e.g. after running the example's sft step)")
        return name
    if not (embedded / "config.json").exists():
        raise UserError(f"the embedded model {name!r} is missing at {embedded}; rebuild it with "
                        f"`bash scripts/build_tiny_model.sh {name}`")
    return str(embedded)
