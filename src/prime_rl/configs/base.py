"""The one settings base class every config is built on.

`BaseConfig` is a section (`[trainer.optim]`, `[loss]`, ...): strict, unknown keys are
errors. `EntrypointConfig` is what an entrypoint (`rl`, `trainer`, ...) parses: a
pydantic-settings model whose sources are, by precedence,

    CLI overrides  >  PRIME_* environment variables  >  later TOML  >  earlier TOML  >  defaults

Use `prime_rl.configs.cli.parse_config(MyConfig, argv)` to build one from the command line.

A config is made in two steps: validation (each field, then `check_consistency`: rules across keys, which only
check), then derivation (`derived`: the values that follow from others, filled in on a copy by `with_values`).
`build` does both; prime-rl's code never assigns to a config after it (an assignment is validated again, not derived
again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from prime_rl.configs.describe import field_default, none_word_is_none
from prime_rl.configs.env_vars import ENV_NESTED_DELIMITER, ENV_PREFIX
from prime_rl.configs.strict import reject_misplaced_bools
from prime_rl.configs.toml_io import deep_merge, read_toml

if TYPE_CHECKING:
    from prime_rl.configs.layers import Layer

# The class being built and its TOML files. A context variable because pydantic-settings
# builds sources from the class, not the instance; the class check keeps nested entrypoint
# configs (`rl`'s `[trainer]` default) from reading the outer command's files and env vars.
_building: ContextVar[tuple[type | None, tuple[Path, ...]]] = ContextVar("_building", default=(None, ()))
# True while an entrypoint config validates its fields: an entrypoint config nested in another
# (`rl`'s components) leaves its cross-field checks to the outer one (see check_consistency).
_inside_entrypoint: ContextVar[bool] = ContextVar("_inside_entrypoint", default=False)

# Every config: unknown keys are errors, assignments are validated, a float must be finite
# (inf/nan only where a field says Field(allow_inf_nan=True)), and a boolean only goes to an
# on/off key (`prime_rl.configs.strict`).
_STRICT = dict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True, allow_inf_nan=False)
NONE = "none"
"""The word for None where a value is text (the command line, PRIME_* variables, a TOML file)."""


M = TypeVar("M", bound=BaseModel)


def with_values(model: M, values: Mapping[str, Any]) -> M:
    """A deep copy of `model` with each dotted key of `values` (`inference.port`) set; `model` itself is never
    changed, and the copy shares no section with it. Each key must name a field (a section on the way must not be
    none). The values are derived ones: not validated again (whoever derives them is their check) and not counted as
    set by the user (`model_fields_set` stays as it was, so a later rule on what the user set still sees only
    that)."""
    return _with_values(model.model_copy(deep=True), values, type(model).__name__)


def _with_values(model: M, values: Mapping[str, Any], where: str) -> M:
    nested: dict[str, dict[str, Any]] = {}
    update: dict[str, Any] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head not in type(model).model_fields:
            raise ValueError(f"with_values: {where} has no field {head!r}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            update[head] = value
    clash = nested.keys() & update.keys()
    if clash:
        raise ValueError(f"with_values: {sorted(clash)} set both as a whole and in part")
    for head, sub in nested.items():
        section = getattr(model, head)
        if not isinstance(section, BaseModel):
            raise ValueError(f"with_values: {where}.{head} is {section!r}, not a section to set keys in")
        update[head] = _with_values(section, sub, f"{where}.{head}")
    copy = model.model_copy(update=update)
    copy.model_fields_set.difference_update(update.keys() - model.model_fields_set)
    return copy


def sections_off(cls: type[BaseModel], data: Any) -> Any:
    """Model validator (mode 'before'): the word `none` is None for any field that may hold None (an optional section
    turned off, `--init none`; a value such as `--ckpt.interval none` or `--trainer.optim.max-norm none`), as
    `PRIME_INIT=none` is for the environment (pydantic-settings' own rule, for the environment only); a field whose
    literal choices include the word keeps it (`none_word_is_none`)."""
    if not isinstance(data, dict):
        return data
    off = [name for name, value in data.items()
           if value == NONE and name in cls.model_fields and none_word_is_none(cls.model_fields[name].annotation)]
    return {**data, **dict.fromkeys(off)} if off else data


def config_data(model: BaseModel, **dump: Any) -> dict[str, Any]:
    """`model.model_dump(mode="json", **dump)` as a config file holds it: TOML has no null, so a None whose field
    defaults to something else is written as the word `none` (read back as None, `sections_off`); a None that is the
    default is left out (`toml_io.dump_toml`), which reads back the same."""
    return _nones_named(model, model.model_dump(mode="json", **dump))


def _nones_named(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    for name, field in type(model).model_fields.items():
        if name not in dumped:
            continue
        value = getattr(model, name)
        if value is None and field_default(field) is not None and none_word_is_none(field.annotation):
            dumped[name] = NONE
        elif isinstance(value, BaseModel) and isinstance(dumped[name], dict):
            _nones_named(value, dumped[name])
        elif isinstance(value, list | tuple) and isinstance(dumped[name], list):
            for item, item_dump in zip(value, dumped[name], strict=False):
                if isinstance(item, BaseModel) and isinstance(item_dump, dict):
                    _nones_named(item, item_dump)
    return dumped



class BaseConfig(BaseModel):
    """A config section: typed, validated on assignment, unknown keys rejected, floats finite."""

    model_config = ConfigDict(**_STRICT)

    _no_misplaced_bools = model_validator(mode="before")(classmethod(reject_misplaced_bools))
    _sections_off = model_validator(mode="before")(classmethod(sections_off))


class _TomlFilesSource(PydanticBaseSettingsSource):
    """The TOML files given with `@ file.toml`, deep-merged in order (later wins)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        raise NotImplementedError  # __call__ is overridden; pydantic-settings requires the method

    def __call__(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for path in _building.get()[1]:
            merged = deep_merge(merged, read_toml(path))
        return merged


class EntrypointConfig(BaseSettings):
    """Top-level config of one entrypoint, built from TOML files, env vars and CLI flags."""

    model_config = SettingsConfigDict(
        **_STRICT,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        env_parse_none_str=NONE,
    )

    # Set by subclasses: the command name shown in --help, and keys --help leaves out of
    # nested sections (rl's shared keys, which its components inherit).
    command: ClassVar[str] = ""
    help_hidden: ClassVar[tuple[str, ...]] = ()
    # How the command holds its output_dir's run lock when started by hand (`run_lock.py`): "shared" (the
    # trainer and orchestrator of one run side by side), "exclusive", or None (no output_dir, or the lock is
    # taken later: rl's `prepare_run_dir`).
    run_lock: ClassVar[str | None] = None

    _no_misplaced_bools = model_validator(mode="before")(classmethod(reject_misplaced_bools))
    _sections_off = model_validator(mode="before")(classmethod(sections_off))

    def check_consistency(self, prefix: str = "") -> None:
        """Rules that tie several keys (or files they name) together; raise ValueError naming `prefix` + key.

        Runs once, on the outermost entrypoint config, after every field is validated, and on
        each validated assignment; it only checks (a value that follows from others is `derived`'s). A config
        nested in another (`rl`'s `[trainer]`) does not run its own: its shared keys are `rl`'s, so `rl` runs it
        (with a prefix) on the component as `derived` will hand it down.
        """

    def derived(self) -> EntrypointConfig:
        """The config the command runs with: a copy with the values that follow from others filled in (`rl` hands
        its shared keys down to its components), by `with_values`. Called once, by `build`, after validation;
        by default the config itself (nothing to derive)."""
        return self

    @classmethod
    def settle_layers(cls, layers: Sequence[Layer]) -> tuple[dict[str, Any], list[str]]:
        """Rules on which layer set a key, which the merged config cannot tell (`configs.layers`; `sft`'s
        model.name against [init]): values to set over the command line's, and one-line notices to print.
        A conflict raises ConfigError. Called by `configs.cli.build_config`; by default nothing."""
        return {}, []

    @model_validator(mode="wrap")
    @classmethod
    def _mark_inside(cls, data: Any, handler: Any) -> Any:
        token = _inside_entrypoint.set(True)
        try:
            return handler(data)
        finally:
            _inside_entrypoint.reset(token)

    @model_validator(mode="after")
    def _consistent(self) -> EntrypointConfig:
        if not _inside_entrypoint.get():
            self.check_consistency()
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if _building.get()[0] is not settings_cls:
            return (init_settings,)
        # init kwargs carry the CLI overrides, so they outrank the environment.
        return (init_settings, env_settings, _TomlFilesSource(settings_cls))

    @classmethod
    def validate_layer(cls, values: dict[str, Any]) -> None:
        """Validate `values` (one TOML file's) on their own: no other source, no rule across keys; raises
        pydantic's ValidationError. `configs.cli.check_layers` keeps the errors at keys the file sets."""
        building, inside = _building.set((None, ())), _inside_entrypoint.set(True)
        try:
            cls(**values)
        finally:
            _inside_entrypoint.reset(inside)
            _building.reset(building)

    @classmethod
    def build(cls, toml_files: list[Path] | tuple[Path, ...] = (), overrides: dict[str, Any] | None = None):
        """Build the config from TOML files (in order) and CLI-style nested overrides: validated, then derived."""
        token = _building.set((cls, tuple(Path(p) for p in toml_files)))
        try:
            return cls(**(overrides or {})).derived()
        finally:
            _building.reset(token)
