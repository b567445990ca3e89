"""The model's context length, read at load time from its config.json when that is on this machine.

`model.name` is looked up without network access: the embedded model, SmolLM2 (converted into the
cache on first use), a local directory, or a hub name already in the Hugging Face cache. A model that
is not here yet (a directory a previous step such as the example's `sft` will create) has no
known context: the checks that need it are skipped, and a missing local directory is
reported when the run starts. A local model directory whose config.json is missing or
unreadable is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from prime_rl.models.embedded import EMBEDDED_MODELS, hub_config_file, looks_like_local_path, resolve_model_path
from prime_rl.models.smollm2 import is_smollm2
from prime_rl.utils.errors import UserError

CONTEXT_KEYS = ("max_position_embeddings", "n_positions")
"""Where Hugging Face configs state the longest sequence (top level, or under text_config)."""


def local_config_file(name: str) -> Path | None:
    """The config.json of `model.name` on this machine, or None when the model is not here."""
    if name in EMBEDDED_MODELS or is_smollm2(name):
        try:
            return Path(resolve_model_path(name)) / "config.json"
        except UserError as exc:
            raise ValueError(str(exc)) from None
    local = Path(name).expanduser()
    if local.is_dir():
        return local / "config.json"
    if looks_like_local_path(name):
        return None
    return hub_config_file(name)


def context_length(name: str) -> tuple[int, Path] | None:
    """(context length, config.json it came from) for `model.name`; None when not known locally."""
    path = local_config_file(name)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"model {name!r}: {path} is missing (a model directory needs its config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise ValueError(f"model {name!r}: cannot read {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"model {name!r}: {path} does not hold a JSON object")
    for table in (data, data.get("text_config")):
        for key in CONTEXT_KEYS:
            value = table.get(key) if isinstance(table, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, path
    return None


def vocabulary_mismatch(name: str, other: str, trust_remote_code: bool = False) -> str | None:
    """How the tokenizers of models `name` and `other` differ (their token -> id maps), or None when they are
    the same or either model is not on this machine (then nothing can be compared before the run starts)."""
    paths = [local_config_file(n) for n in (name, other)]
    if any(path is None or not path.is_file() for path in paths):
        return None
    from transformers import AutoTokenizer

    try:
        vocabs = [AutoTokenizer.from_pretrained(str(path.parent), trust_remote_code=trust_remote_code).get_vocab()
                  for path in paths]
    except Exception as exc:  # transformers raises many types; the message is what matters
        raise ValueError(f"cannot load the tokenizer of {name!r} or {other!r}: {str(exc).splitlines()[0]}") from None
    if vocabs[0] == vocabs[1]:
        return None
    differ = sorted(set(vocabs[0].items()) ^ set(vocabs[1].items()), key=lambda item: (item[1], item[0]))
    token = differ[0][0]
    ids = [vocab.get(token, "absent") for vocab in vocabs]
    return (f"{len(vocabs[0])} vs {len(vocabs[1])} tokens; token {token!r} is id {ids[0]} in {name!r} "
            f"and {ids[1]} in {other!r}")
