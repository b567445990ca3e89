"""The `[loss]` union: defaults, validation, dict configs, missing inputs, and the documented custom loss."""

from __future__ import annotations

import math
import re
import tomllib
import warnings

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from prime_rl.configs.loss import LossConfig
from prime_rl.trainer.rl.loss import build_loss, compute_step_loss, parse_loss_config
from prime_rl.trainer.rl.losses import LossInputs, LossScale
from prime_rl.utils.errors import ConfigError
from tests.support import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "custom_loss"
ADAPTER = TypeAdapter(LossConfig)

DEFAULT_NORMALIZATION = {
    "default": "token",
    "sapo": "sequence",
    "cispo": "token",
    "vanilla": "token",
    "grpo": "sequence",
    "bnpo": "token",  # TRL's sum(l) / sum(T), over the step
    "dr_grpo": "constant",
    "dapo": "token",
    "gspo": "sequence",
    "gspo_token": "sequence",
    "fipo": "token",
    "is_reshape": "token",
}


@pytest.mark.parametrize(("loss_type", "normalization"), DEFAULT_NORMALIZATION.items())
def test_each_type_has_its_default_normalization_and_can_override_it(loss_type, normalization):
    assert ADAPTER.validate_python({"type": loss_type}).normalization == normalization
    assert ADAPTER.validate_python({"type": loss_type, "normalization": "constant"}).normalization == "constant"


def test_documented_defaults():
    d = ADAPTER.validate_python({"type": "default"})
    assert (d.token_mask_low, d.token_mask_high, d.geo_mask_low, d.geo_mask_high) == (0.125, 8.0, 0.1, 10.0)
    assert (d.sequence_mask_low, d.sequence_mask_high, d.sequence_clip_high, d.ratio_type) == (0, 100, 10, "token")
    assert (d.adv_tau, d.teacher_tau, d.kl_tau, d.kl_coef, d.entropy_coef) == (1, 0, 0, 0, 0)
    s = ADAPTER.validate_python({"type": "sapo"})
    assert (s.tau_pos, s.tau_neg) == (1.0, 1.05)
    c = ADAPTER.validate_python({"type": "cispo"})
    assert (c.eps_high, c.eps_low) == (5.0, None)
    for t in ("grpo", "bnpo", "dr_grpo"):
        g = ADAPTER.validate_python({"type": t})
        assert (g.eps_low, g.eps_high, g.dual_clip_c, g.opsm_delta) == (0.2, 0.2, None, None)
    assert ADAPTER.validate_python({"type": "dapo"}).eps_high == 0.28
    g = ADAPTER.validate_python({"type": "gspo"})
    assert (g.eps_low, g.eps_high) == (3e-4, 4e-4)
    f = ADAPTER.validate_python({"type": "fipo"})
    assert (f.gamma, f.eps_f, f.detach_influence, f.eps_low, f.eps_high) == (0.99, 0.2, True, 0.2, 0.28)
    r = ADAPTER.validate_python({"type": "is_reshape"})
    assert (r.rho_min, r.tau, r.T, r.gamma_min, r.clip_weight, r.clip_threshold) == (0.3, 1.0, 5.0, 0.05, False, 10)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"type": "default", "token_mask_low": 9.0}, "token_mask_low"),
        ({"type": "default", "geo_mask_low": 10.0, "geo_mask_high": 10.0}, "geo_mask_low"),
        ({"type": "sapo", "tau_pos": 0}, "tau_pos"),
        ({"type": "sapo", "tau_neg": -1}, "tau_neg"),
        ({"type": "grpo", "dual_clip_c": 0.5}, "dual_clip_c"),
        ({"type": "dapo", "eps_low": 1.5}, "eps_low"),
        ({"type": "nope"}, "nope"),
        ({"type": "grpo", "tau_pos": 1.0}, "tau_pos"),  # unknown key for this type
        ({"type": "default", "kl_type": "k9"}, "kl_type"),
    ],
)
def test_invalid_configs_name_the_key(config, message):
    with pytest.raises(ValidationError, match=message):
        parse_loss_config(config)


def test_sapo_warns_when_tau_neg_below_tau_pos():
    with pytest.warns(UserWarning, match="tau_neg"):
        parse_loss_config({"type": "sapo", "tau_pos": 2.0, "tau_neg": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_loss_config({"type": "sapo"})


def test_dict_and_model_configs_give_the_same_loss():
    model = ADAPTER.validate_python({"type": "sapo", "tau_pos": 0.7})
    lp = torch.tensor([-1.0, -0.4, -2.0], requires_grad=True)
    mb = LossInputs(lp, torch.tensor([-1.2, -0.5, -1.5]), torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, dtype=bool),
                    torch.tensor([2, 1]))  # fmt: skip
    a = compute_step_loss(model, [mb], max_tokens=4).loss
    b = compute_step_loss({"type": "sapo", "tau_pos": 0.7}, [mb], max_tokens=4).loss
    assert a.item() == b.item()


def one_token_batch(**extra) -> LossInputs:
    one = torch.zeros(1)
    return LossInputs(one.clone().requires_grad_(), one, one + 1, torch.ones(1, dtype=bool), torch.tensor([1]), **extra)


def test_missing_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="ref_logprobs"):
        build_loss({"type": "grpo", "kl_coef": 0.1})(one_token_batch(), LossScale(1, 1, 1))
    with pytest.raises(ConfigError, match="teacher_logprobs"):
        build_loss({"type": "default", "teacher_tau": 0.5})(one_token_batch(), LossScale(1, 1, 1))
    with pytest.raises(ConfigError, match="entropies"):
        build_loss({"type": "cispo", "entropy_coef": 0.1})(one_token_batch(), LossScale(1, 1, 1))


def test_kl_and_entropy_terms():
    # d = lp - ref = 0.5; k1 = 0.5, k2 = 0.125, k3 = e^-0.5 + 0.5 - 1; entropy bonus subtracts coef * H.
    batch = one_token_batch(ref_logprobs=torch.tensor([-0.5]), entropies=torch.tensor([2.0]))
    base = build_loss({"type": "vanilla"})(batch, LossScale(1, 1, 1)).loss.item()
    k3 = math.exp(-0.5) + 0.5 - 1
    expect = {"k1": 0.5, "k2": 0.125, "k3": k3, "low_var_kl": k3}
    for kl_type, kl in expect.items():
        out = build_loss({"type": "vanilla", "kl_coef": 0.2, "kl_type": kl_type, "entropy_coef": 0.1})(
            batch, LossScale(1, 1, 1)
        )
        assert out.loss.item() == pytest.approx(base + 0.2 * kl - 0.1 * 2.0)
        assert out.metrics["loss/kl_ref"].tolist() == pytest.approx([kl, 1])
        assert out.metrics["loss/entropy"].tolist() == pytest.approx([2.0, 1])


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("math:no_such_fn", "module 'math' has no 'no_such_fn'"),
        ("math:pi", "'math:pi' is not a function or class (it is of type float)"),
        ("justaname", "must look like"),
    ],
)
def test_custom_import_errors_are_config_errors(path, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        parse_loss_config({"type": "custom", "import_path": path})


def test_documented_custom_loss_example_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    # The doc shows the example module and TOML verbatim.
    doc = (ROOT / "docs" / "bring-your-own-algorithm.md").read_text()
    module_src = (EXAMPLE / "my_loss.py").read_text()
    toml_src = (EXAMPLE / "loss.toml").read_text()
    assert module_src.strip() in doc and toml_src.strip() in doc
    assert len([line for line in module_src.splitlines() if line.strip()]) <= 12
    config = parse_loss_config(tomllib.loads(toml_src)["loss"])
    assert config.type == "custom" and config.kwargs == {"max_weight": 2.0}

    lp = torch.tensor([-1.0, -0.5, -2.0, -0.1], requires_grad=True)
    lq = torch.tensor([-1.0, -1.5, -2.0, float("nan")])  # the last token is a prompt token
    adv = torch.tensor([1.0, 1.0, -2.0, 0.0])
    mask = torch.tensor([True, True, True, False])
    out = compute_step_loss(config, [LossInputs(lp, lq, adv, mask, torch.tensor([2, 2]))], max_tokens=4)
    # Per-token -sg(min(r, 2)) A lp with r = 1, e (capped at 2), 1; token mean over 3 trained tokens.
    assert out.loss.item() == pytest.approx((1.0 + 2 * 0.5 + 2 * -2.0) / 3)
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert grad.tolist() == pytest.approx([-1 / 3, -2 / 3, 2 / 3, 0.0])
    assert "loss/soft_gate_weight" not in out.metrics and out.metrics["loss/importance_ratio"].isfinite()


def custom_summed(inputs: LossInputs, coef: float = 1.0):
    """A custom loss returning a summed loss and a per-token metric."""
    per_token = -inputs.advantages * inputs.trainer_logprobs * inputs.loss_mask
    return coef * per_token.sum(), {"my_metric": inputs.advantages}


def test_custom_summed_loss_and_metrics():
    config = {"type": "custom", "import_path": f"{__name__}:custom_summed", "kwargs": {"coef": 2.0}}
    lp = torch.tensor([-1.0, -0.5], requires_grad=True)
    mb = LossInputs(lp, lp.detach(), torch.tensor([1.0, 3.0]), torch.ones(2, dtype=bool), torch.tensor([2]))
    out = compute_step_loss(config, [mb], max_tokens=4)
    assert out.loss.item() == pytest.approx(2 * (1.0 + 1.5) / 2)
    assert out.metrics["loss/my_metric"].item() == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="sequence"):
        compute_step_loss({**config, "normalization": "sequence"}, [mb], max_tokens=4)


def sapo_through_the_view_contract(view, **kwargs):
    """A custom loss written as the built-ins are (`contract = "view"`): here it is the built-in SAPO itself."""
    from prime_rl.configs.loss import SapoLossConfig
    from prime_rl.trainer.rl.losses import sapo_loss

    return sapo_loss(SapoLossConfig(**kwargs), view)


def test_a_custom_loss_on_the_view_contract_is_bit_identical_to_the_built_in_it_reimplements():
    g = torch.Generator().manual_seed(0)
    lp = (torch.randn(12, generator=g) - 1).requires_grad_()
    mb = LossInputs(lp, lp.detach() + 0.3 * torch.randn(12, generator=g), torch.randn(12, generator=g),
                    torch.rand(12, generator=g) > 0.2, torch.tensor([5, 7]))
    built_in = compute_step_loss({"type": "sapo", "tau_pos": 0.8}, [mb], max_tokens=8)
    (grad_built_in,) = torch.autograd.grad(built_in.loss, lp)
    from prime_rl.configs.loss import SapoLossConfig

    normalization = SapoLossConfig().normalization  # the framework's part: the same normalization
    custom = compute_step_loss({"type": "custom", "contract": "view", "kwargs": {"tau_pos": 0.8},
                                "normalization": normalization,
                                "import_path": f"{__name__}:sapo_through_the_view_contract"}, [mb], max_tokens=8)
    (grad_custom,) = torch.autograd.grad(custom.loss, lp)
    assert torch.equal(custom.loss, built_in.loss) and torch.equal(grad_custom, grad_built_in)
    assert custom.metrics.keys() == built_in.metrics.keys()  # soft gate and clip metrics included
    assert all(torch.equal(custom.metrics[k], built_in.metrics[k]) for k in built_in.metrics)


def not_a_term(view):
    return view.lp


def test_a_view_contract_loss_must_return_a_policy_term():
    lp = torch.tensor([-1.0, -0.5], requires_grad=True)
    mb = LossInputs(lp, lp.detach(), torch.tensor([1.0, 3.0]), torch.ones(2, dtype=bool), torch.tensor([2]))
    with pytest.raises(TypeError, match="expected a PolicyTerm"):
        compute_step_loss({"type": "custom", "contract": "view", "import_path": f"{__name__}:not_a_term"}, [mb], 4)
