"""`configs.extensions.Registry` and `envs.register_env`: what a registration may and may not do."""

from __future__ import annotations

import sys
import textwrap
from typing import Literal

import pytest
from pydantic import TypeAdapter, ValidationError

from prime_rl.configs.base import BaseConfig
from prime_rl.configs.extensions import Registry
from prime_rl.envs import ENVIRONMENTS, register_env
from prime_rl.envs.reverse_text import ReverseTextEnv

MODULE = "registry_impl_for_tests"


def config_class(name: str, module: str = __name__) -> type[BaseConfig]:
    return type(f"{name.title()}Config", (BaseConfig,), {"__annotations__": {"type": Literal[name]}, "type": name,
                                                          "__module__": module})


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry of two configs, `a` and `b`, implemented in a module the test writes."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    reg = Registry("thing", implemented_in=MODULE)
    reg.config(config_class("a"))
    reg.config(config_class("b"))
    module_globals = sys.modules[__name__].__dict__
    module_globals["REGISTRY"] = reg
    yield reg, tmp_path / f"{MODULE}.py"
    module_globals.pop("REGISTRY")
    sys.modules.pop(MODULE, None)


IMPL = f"""
from {__name__} import REGISTRY

@REGISTRY.implements(REGISTRY.configs["a"])
def a(x):
    return x + 1
"""


def test_implementations_register_on_first_use_and_drift_names_the_missing(registry):
    reg, module = registry
    module.write_text(IMPL)
    assert reg.implementation("a")(1) == 2
    assert reg.drift() == ["thing 'b' has a config and no implementation"]
    with pytest.raises(ValueError, match=r"unknown thing 'c' \(known: a, b\)"):
        reg.implementation("c")
    # A config whose implementing module nobody imports: said so, not "unknown" beside its own name.
    with pytest.raises(ValueError, match=f"thing 'b' has a config but no implementation: .* imported by {MODULE}$"):
        reg.implementation("b")


def test_a_module_that_failed_half_way_can_be_imported_again(registry):
    # The first import registers `a`, then raises; the fixed module registers the same function again.
    reg, module = registry
    module.write_text(IMPL + "raise RuntimeError('a bug at the end of the module')\n")
    with pytest.raises(RuntimeError, match="a bug"):
        reg.implementation("a")
    module.write_text(IMPL)
    sys.modules.pop(MODULE, None)
    assert reg.implementation("a")(1) == 2


def test_a_second_implementation_or_config_under_one_name_is_refused(registry):
    reg, module = registry
    module.write_text(IMPL + textwrap.dedent("""
        @REGISTRY.implements(REGISTRY.configs["a"])
        def another(x):
            return x
    """))
    with pytest.raises(ValueError, match="thing 'a' has two implementations"):
        reg.implementation("a")
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        reg.config(config_class("a", module="elsewhere"))
    with pytest.raises(ValueError, match="is not a registered thing config"):
        reg.implements(config_class("c"))(lambda x: x)


def test_the_union_is_the_registered_classes_and_closes_the_registry():
    reg = Registry("thing", implemented_in=MODULE)
    a, b = reg.config(config_class("a")), reg.config(config_class("b"))
    adapter = TypeAdapter(reg.union())
    assert type(adapter.validate_python({"type": "a"})) is a and type(adapter.validate_python({"type": "b"})) is b
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "c"})
    with pytest.raises(ValueError, match="registered after its config union was built"):
        reg.config(config_class("c"))


def test_a_section_without_a_type_is_the_registrys_default_type():
    reg = Registry("thing", implemented_in=MODULE, default="b")
    a, b = reg.config(config_class("a")), reg.config(config_class("b"))
    adapter = TypeAdapter(reg.union())
    assert type(adapter.validate_python({})) is b and type(adapter.validate_python({"type": "a"})) is a
    plain = Registry("thing", implemented_in=MODULE)
    plain.config(config_class("a"))
    with pytest.raises(ValidationError, match="Unable to extract tag"):  # without a default, the type is needed
        TypeAdapter(plain.union()).validate_python({})


def test_what_a_scope_registers_is_unregistered_when_it_ends_and_may_be_registered_again():
    """A test's extension (a module registering at import, imported again by a later test) leaves the registry as
    it found it; a second implementation would be refused if the first one were left behind."""
    reg = Registry("thing", implemented_in=MODULE)
    reg.config(config_class("a"))
    for implementation in (len, abs):
        with reg.scoped():
            reg.implements(reg.config(config_class("b")))(implementation)
            assert reg.names == ("a", "b")
        assert reg.names == ("a",)
    reg.unregister("a")
    assert reg.names == ()
    with pytest.raises(ValueError, match="thing 'a' is not registered"):
        reg.unregister("a")


def test_register_env_accepts_the_same_class_again_and_refuses_another(monkeypatch):
    monkeypatch.setattr("prime_rl.envs.registry.ENVIRONMENTS", dict(ENVIRONMENTS))
    from prime_rl.envs import registry as env_registry

    again = type("ReverseTextEnv", (ReverseTextEnv,), {"__module__": ReverseTextEnv.__module__,
                                                        "__qualname__": ReverseTextEnv.__qualname__})
    assert register_env(again) is again and env_registry.ENVIRONMENTS["reverse-text"] is again
    other = type("MyReverse", (ReverseTextEnv,), {"id": "reverse-text"})
    with pytest.raises(ValueError, match="environment 'reverse-text' is registered twice"):
        register_env(other)
