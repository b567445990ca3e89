"""Command-line front end shared by every entrypoint.

    <command> [@ file.toml ...] [--dotted.key value ...] [--flag | --no-flag] [--dry-run] [--help]

Keys may use `-` or `_` (`--max-steps` == `--max_steps`). Values are read as TOML
literals when they parse as one (`7`, `1e-5`, `true`, `[0, 1]`, `"text"`) and as plain
strings otherwise (`--loss.type sapo`). A bare `--flag` / `--no-flag` (no value, or followed
by another option or file) is only for on/off keys: for any other key it is an error, never
`true` (= 1 step for `--max-steps`). Unknown `PRIME_*` variables: `prime_rl.configs.env_vars`.
"""

from __future__ import annotations

import os
import sys
import tomllib
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from prime_rl.configs.base import EntrypointConfig, config_data
from prime_rl.configs.describe import describe_config, model_types, tag_of
from prime_rl.configs.env_vars import ENV_PREFIX, env_name, unknown_env_vars
from prime_rl.configs.layers import config_layers
from prime_rl.configs.strict import check_bare_flags
from prime_rl.configs.toml_io import deep_merge, dump_toml, read_toml
from prime_rl.run_lock import take_for_component
from prime_rl.utils.disk import as_disk_error
from prime_rl.utils.errors import ConfigError, PrimeError

C = TypeVar("C", bound=EntrypointConfig)


class ParsedArgs(typing.NamedTuple):
    toml_files: list[Path]
    overrides: dict[str, Any]
    help: bool
    dry_run: bool
    bare_flags: tuple[str, ...] = ()  # keys given as --key / --no-key without a value


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p.replace("-", "_") for p in dotted.split(".")]
    if any(not p for p in parts):
        raise ConfigError(f"malformed option --{dotted}")
    node = target
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"option --{dotted} conflicts with an earlier value for --{part}")
        node = child
    node[parts[-1]] = value


def _flag_target(key: str) -> tuple[str, bool]:
    """A bare flag's key and whether it is negated: `--a.b` is true; `--no-a.b` and `--a.no-b` are false."""
    head, _, last = key.rpartition(".")
    if last.startswith(("no-", "no_")):
        return (head + "." if head else "") + last[3:], True
    if head and key.startswith(("no-", "no_")):
        return key[3:], True
    return key, False


def parse_args(argv: Sequence[str]) -> ParsedArgs:
    """Split argv into TOML files, nested overrides and the --help/--dry-run flags."""
    files: list[Path] = []
    overrides: dict[str, Any] = {}
    bare_flags: list[str] = []
    want_help = dry_run = False
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            want_help = True
        elif arg == "--dry-run":
            dry_run = True
        elif arg == "@":
            if i + 1 >= len(args):
                raise ConfigError("'@' must be followed by a TOML file path")
            files.append(Path(args[i + 1]))
            i += 1
        elif arg.startswith("@"):
            files.append(Path(arg[1:]))
        elif arg.startswith("--"):
            key, eq, inline = arg[2:].partition("=")
            if eq:
                _set_dotted(overrides, key, _parse_value(inline))
            elif i + 1 < len(args) and not args[i + 1].startswith("--") and not args[i + 1].startswith("@"):
                _set_dotted(overrides, key, _parse_value(args[i + 1]))
                i += 1
            else:
                target, negated = _flag_target(key)
                _set_dotted(overrides, target, not negated)
                bare_flags.append(target)
        else:
            raise ConfigError(f"unexpected argument {arg!r}: use '@ file.toml' or '--key value'")
        i += 1
    return ParsedArgs(files, overrides, want_help, dry_run, tuple(bare_flags))


# ---------------------------------------------------------------------------- errors


def _walk(root: type[BaseModel], loc: Sequence[Any]) -> tuple[str, type[BaseModel] | None]:
    """Follow an error location through nested models, list indices and union tags.

    Returns the dotted key as the user writes it and the model class reached, if any.
    """
    parts: list[str] = []
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        if isinstance(part, int):
            if parts:
                parts[-1] += f"[{part}]"
            continue
        if len(candidates) > 1:
            # Inside a discriminated union pydantic puts the variant's tag into the location.
            tagged = [m for m in candidates if tag_of(m) == part]
            if tagged:
                candidates = tagged
                continue
        parts.append(str(part))
        field = candidates[0].model_fields.get(part) if len(candidates) == 1 else None
        candidates = model_types(field.annotation) if field is not None else []
    return ".".join(parts), candidates[0] if len(candidates) == 1 else None


def _is_secret(root: type[BaseModel], loc: tuple) -> bool:
    """Whether `loc` is a SecretStr field, whose value an error message must not echo."""
    parent = _walk(root, loc[:-1])[1] if loc else None
    field = parent.model_fields.get(str(loc[-1])) if parent is not None else None
    return field is not None and "SecretStr" in str(field.annotation)


def _set_in(layer: dict[str, Any], loc: Sequence[Any]) -> bool:
    """Whether the error location `loc` is a value `layer` itself sets (not a section, not a default)."""
    node: Any = layer
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue  # a discriminated union's tag
        if not isinstance(node, dict | list):
            return False
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    return not isinstance(node, dict)


def check_layers(config_cls: type[EntrypointConfig], toml_files: Sequence[Path]) -> None:
    """Every TOML file's values, and the PRIME_* variables', are valid on their own, also those a later file, a
    PRIME_* variable or the command line overrides (a wrong type hidden by an override is still a wrong file or
    variable): a ConfigError naming the file (or the variable) and the first bad key it sets. Rules across keys are
    judged on the merged config only."""
    for path in toml_files:
        _check_layer(config_cls, read_toml(path), lambda key, message, path=path: f"{path}: {message}")
    try:
        env = EnvSettingsSource(config_cls)()
    except SettingsError:
        return  # a section variable that is not JSON: the build says so in one line
    _check_layer(config_cls, env, lambda key, message: f"environment variable {env_name(key)}: {message}")


def _check_layer(config_cls: type[EntrypointConfig], layer: dict[str, Any],
                 where: Callable[[str, str], str]) -> None:
    """A ConfigError for the first error at a key `layer` sets: `where(dotted key, message)`."""
    try:
        config_cls.validate_layer(layer)
    except ValidationError as exc:
        own = [error for error in exc.errors(include_url=False) if _set_in(layer, error.get("loc", ()))]
        if own:
            key = ".".join(str(part) for part in own[0]["loc"] if isinstance(part, str))
            raise ConfigError(where(key, format_errors(own, config_cls))) from None


def format_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    """One line: the first problem, naming the key and what is allowed."""
    return format_errors(exc.errors(include_url=False), root)


def format_errors(errors: list[dict[str, Any]], root: type[BaseModel]) -> str:
    """One line for pydantic's `errors` (at least one): the first problem, naming the key and what is allowed."""
    first = errors[0]
    loc = first.get("loc", ())
    key = _walk(root, loc)[0] or "<root>"
    if first["type"] == "extra_forbidden":
        parent = _walk(root, loc[:-1])[1]
        allowed = ", ".join(parent.model_fields) if parent is not None else ""
        msg = f"unknown config key '{key}'" + (f" (allowed here: {allowed})" if allowed else "")
    else:
        got = first.get("input")
        hidden = isinstance(got, dict | list) or got is None or _is_secret(root, loc)
        shown = "" if hidden else f" (got {got!r})"
        text = first["msg"].removeprefix("Value error, ")
        msg = f"invalid config: {text}" if key == "<root>" else f"invalid value for '{key}': {text}{shown}"
    if len(errors) > 1:
        msg += f" [and {len(errors) - 1} more problem(s)]"
    return msg


# ---------------------------------------------------------------------------- help


def render_help(config_cls: type[EntrypointConfig]) -> str:
    doc = (config_cls.__doc__ or "").strip().splitlines()
    head = [
        f"usage: {config_cls.command or 'command'} [@ file.toml ...] [--key value ...] [--dry-run] [--help]",
        "",
        doc[0] if doc else "",
        "",
        "Precedence: CLI > PRIME_* env vars (nested with __) > later TOML > earlier TOML > defaults.",
        "Booleans: --flag / --no-flag. Keys accept '-' or '_'.",
        "",
    ]
    lines = []
    for item in describe_config(config_cls):
        if item.is_section:
            lines.append(f"[{item.key}] {item.description}")
            continue
        cond = f" [{item.condition}]" if item.condition else ""
        default = f" (default: {item.default})" if item.default else ""
        lines.append(f"--{item.key} {item.type}{cond}  {item.description}{default}")
    if config_cls.help_hidden:
        lines.append(f"(components take the shared keys from the top level: {', '.join(config_cls.help_hidden)})")
    return "\n".join(head + lines)


# ---------------------------------------------------------------------------- entry


def build_config(config_cls: type[C], argv: Sequence[str]) -> tuple[C, ParsedArgs]:
    """Parse argv and validate; warnings (ignored PRIME_* variables) and the notices of `settle_layers` (a layer's
    value that a later layer set aside) go to stderr as one line each."""
    args = parse_args(argv)
    check_bare_flags(config_cls, args.bare_flags)
    for name in unknown_env_vars(config_cls, os.environ):
        print(f"warning: ignoring environment variable {name}: not a config key of {config_cls.command}",
              file=sys.stderr)
    check_layers(config_cls, args.toml_files)
    try:
        settled, notices = config_cls.settle_layers(config_layers(config_cls, args.toml_files, args.overrides))
        config = config_cls.build(args.toml_files, deep_merge(args.overrides, settled))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, config_cls)) from None
    except SettingsError as exc:  # a PRIME_* variable for a section that is not JSON
        raise ConfigError(f"invalid {ENV_PREFIX}* environment variable: {exc}".replace("\n", " ")) from None
    for notice in notices:
        print(f"note: {notice}", file=sys.stderr)
    return config, args


def fail(message: str, code: int) -> typing.NoReturn:
    try:
        print(f"error: {message}", file=sys.stderr)
    except OSError:  # stderr is a log file on the disk that just filled up; the exit code still tells
        pass
    raise SystemExit(code)


def parse_config(config_cls: type[C], argv: Sequence[str] | None = None) -> C:
    """Parse argv into `config_cls`; handles --help and --dry-run (both exit 0).

    Any config problem prints one line and exits with code 2.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if any(a in ("-h", "--help") for a in argv):
            print(render_help(config_cls))
            raise SystemExit(0)
        config, args = build_config(config_cls, argv)
    except PrimeError as exc:
        fail(str(exc), exc.exit_code)
    if args.dry_run:
        print(dump_toml(config_data(config)), end="")
        raise SystemExit(0)
    return config


def run_main(config_cls: type[C], body: Callable[[C], Any], argv: Sequence[str] | None = None) -> None:
    """The shape of every entrypoint: parse the config, hold the run directory's lock (`run_lock.py`), run,
    turn known errors into one line."""
    config = parse_config(config_cls, argv)
    try:
        lock = None
        if config_cls.run_lock is not None:
            lock = take_for_component(getattr(config, "output_dir", None), config_cls.command,
                                      shared=config_cls.run_lock == "shared")
        try:
            body(config)
        finally:
            if lock is not None:
                lock.release()
    except PrimeError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BaseException as exc:  # DCP's CheckpointException derives from BaseException
        if isinstance(exc, SystemExit | GeneratorExit):
            raise
        disk = as_disk_error(exc, getattr(config, "output_dir", None))
        if disk is None:
            raise
        fail(str(disk), disk.exit_code)
