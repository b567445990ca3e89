"""The value-head critic (`trainer/value_head.py`): values read at t - 1 from the policy's own final hidden
states (0 at segment starts, packed rows with shared prompts), the joint loss's gradient, its config rules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.batch_format import RankBatch
from prime_rl.configs.toml_io import dump_toml
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.batch import Sample, micro_batch
from prime_rl.trainer.config import CriticConfig, LoRAConfig, TrainerConfig
from prime_rl.trainer.critic import ValueTargets, value_loss
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.lora import apply_lora
from prime_rl.trainer.model import forward_rows_logits, from_previous_position
from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.train import step_scale, train_on_batch
from prime_rl.trainer.value_head import ValueHeadCritic
from tests.support.synthetic_batches import random_micro_batch

VOCAB = 99  # the char tokenizer of tiny_model_dir


def tiny(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def test_from_previous_position_shifts_within_segments_and_zeroes_every_segment_start():
    x = torch.arange(1.0, 10.0)  # three segments of 3, 2 and 4 tokens
    y = from_previous_position(x, torch.tensor([3, 2, 4]))
    assert y.tolist() == [0, 1, 2, 0, 4, 0, 6, 7, 8]


@torch.no_grad()
def test_values_are_the_heads_output_at_t_minus_1_of_each_sample_alone(tiny_model_dir):
    """A head equal to lm_head's row k (plus a bias) makes V_t = logits[t - 1, k] + b, which the logits of each
    sample run alone give independently of the hidden-state hook: a row of a lone sample, then a shared prompt
    with three completions (a root and three branches), in one packed row."""
    net = tiny(tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    lone, prompt, *completions = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 7, 4, 1, 6)]
    mb = micro_batch([[Sample(lone[:2], lone[2:], [-1.0] * 3, 1.0, 0)],
                      [Sample(prompt, c, [-1.0] * len(c), 1.0, 0) for c in completions]])
    assert len(mb.sample_lens) == 5  # the lone sample, the shared root, three branches
    head = ValueHeadCritic(CriticConfig(type="value_head"), net, torch.device("cpu"), seed=0)
    k, bias = 11, 0.25
    head.model.weight.copy_(net.get_output_embeddings().weight[k:k + 1])
    head.model.bias.fill_(bias)
    values = head.values(mb)

    expected, root, at = torch.zeros(mb.num_tokens), None, 0
    for length in mb.sample_lens.tolist():
        ids, pos = mb.input_ids[at:at + length], mb.position_ids[at:at + length]
        root = ids if pos[0] == 0 else root  # a branch continues the root before it
        full = ids if pos[0] == 0 else torch.cat([root, ids])  # the sample it stands for
        logits = forward_rows_logits(net, [(full, torch.arange(len(full)), torch.tensor([len(full)]))])[0]
        expected[at + 1:at + length] = logits[pos[1:] - 1, k] + bias  # V_t: the output at t - 1; 0 at the start
        at += length
    assert values[torch.cumsum(mb.sample_lens, 0) - mb.sample_lens].eq(0).all()
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=0)


def fake_session(model, critic) -> SimpleNamespace:
    """What `train_on_batch` uses of a TrainSession (one process, no FSDP)."""
    return SimpleNamespace(model=model, critic=critic, backward=lambda loss: loss.backward(),
                           dist=SimpleNamespace(device=torch.device("cpu")), sampled_vocab=None)


def grads(*modules) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for m in modules for p in m.parameters()
           if p.requires_grad]
    for m in modules:
        m.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.slow
def test_the_joint_gradient_is_the_policys_plus_value_coef_times_the_value_losss(tiny_model_dir, lora):
    """One joint backward == the policy loss's backward + c_V x the value loss's (two separate passes), for the
    trunk (with LoRA: the adapters, which thus learn from the value loss) and the head; the head's step then
    sees grad L_V (its norm is `value/grad_norm`), and the value metrics are the clipped loss's."""
    init_distributed()
    net = tiny(tiny_model_dir)
    if lora:
        apply_lora(net, LoRAConfig(rank=4), seed=0)
    coef = 0.3
    head = ValueHeadCritic(CriticConfig(type="value_head", value_coef=coef, value_clip=0.05), net,
                           torch.device("cpu"), 0)
    g = torch.Generator().manual_seed(1)
    mbs = [random_micro_batch(g, VOCAB, samples=2, prompt_len=3, completion_len=5, rewards=True) for _ in range(2)]
    batch = RankBatch(step=0, temperature=1.0, max_tokens=5, micro_batches=mbs)
    scale = step_scale(batch, torch.device("cpu"))
    with torch.no_grad():  # V_old a little off the current values, so the clip acts on some tokens
        old = [head.values(mb) + 0.1 * torch.randn(mb.num_tokens, generator=g) for mb in mbs]
    targets = ValueTargets(old, [torch.rand(mb.num_tokens, generator=g) * mb.loss_mask for mb in mbs],
                           float(sum(mb.num_loss_tokens for mb in mbs)))
    loss_fn = build_loss({"type": "default"})

    joint_total, metrics = train_on_batch(fake_session(net, head), loss_fn, batch, scale, targets=targets)
    joint = grads(net, head.model)
    policy_total, policy_metrics = train_on_batch(fake_session(net, None), loss_fn, batch, scale)
    policy = grads(net, head.model)
    value_total, clipped = 0.0, 0.0
    for mb, v_old, ret in zip(mbs, targets.old_values, targets.returns, strict=True):
        share, pairs = value_loss(head.values(mb), v_old, ret, mb.loss_mask, targets.count, 0.05)
        share.backward()
        value_total += float(share.detach())
        clipped += float(pairs["value/clip_frac"][0])
    value = grads(net, head.model)

    assert metrics["loss/total"] == pytest.approx(policy_total) and joint_total == pytest.approx(
        policy_total + coef * value_total)
    assert metrics["value/loss"] == pytest.approx(value_total)
    assert metrics["value/clip_frac"] == pytest.approx(clipped / targets.count) and 0 < clipped < targets.count
    assert {k: v for k, v in metrics.items() if not k.startswith("value/")} == pytest.approx(policy_metrics)
    trunk = len(joint) - 2
    assert any(v.abs().max() > 1e-4 for v in value[:trunk])  # the value loss reaches the trunk (the adapters)
    for got, p, v in zip(joint, policy, value, strict=True):
        torch.testing.assert_close(got, p + coef * v, atol=1e-6, rtol=1e-5)

    for param, v in zip(head.model.parameters(), value[trunk:], strict=True):  # what the joint backward left
        param.grad = coef * v
    before = head.model.weight.detach().clone()
    grad_norm = head.step(0, joint_total)
    assert grad_norm == pytest.approx(float(torch.cat([v.flatten() for v in value[trunk:]]).norm()), rel=1e-5)
    assert not torch.equal(head.model.weight, before) and head.model.weight.grad is None


def test_the_head_is_drawn_from_the_seed_and_is_not_part_of_the_policy(tiny_model_dir):
    net = tiny(tiny_model_dir)
    names = set(net.state_dict())
    a, b, c = (ValueHeadCritic(CriticConfig(type="value_head"), net, torch.device("cpu"), seed) for seed in (7, 7, 8))
    assert torch.equal(a.model.weight, b.model.weight) and not torch.equal(a.model.weight, c.model.weight)
    assert a.model.weight.dtype == torch.float32 and a.model.weight.shape == (1, net.config.hidden_size)
    assert set(net.state_dict()) == names  # nothing added to the policy (its weights go to the servers)
    assert a.coef == 0.1  # value_coef unset: 0.1


def gae(critic: dict | None = None) -> dict:
    return {"advantage": {"type": "gae"}, **({"critic": critic} if critic is not None else {})}


def test_critic_type_config_rules():
    assert TrainerConfig.build([], gae({"type": "value_head", "value_coef": 0.5})).critic_in_use.value_loss_coef == 0.5
    assert TrainerConfig.build([], gae()).critic_in_use.type == "separate"
    for critic, words in [({"value_coef": 0.5}, "critic.value_coef weights the value loss in the policy's loss"),
                          ({"type": "separate", "value_coef": 0.1}, "critic.value_coef"),
                          ({"type": "value_head", "model": "somewhere"}, "critic.model is where a separate critic")]:
        with pytest.raises(ValueError, match=words) as caught:
            TrainerConfig.build([], gae(critic))
        assert words in str(caught.value).splitlines()[1]  # one line, naming the field
    with pytest.raises(ValueError, match="critic.value_coef weights"):
        RLConfig.build([], {"orchestrator": {"advantage": {"type": "gae"}}, "trainer": {"critic": {"value_coef": 1}}})
    # `rl` hands the trainer its resolved config as TOML (every field written): an unset value_coef is left out
    # (none), so a separate critic's config reloads without tripping the rule.
    resolved = TrainerConfig.build([], gae({"type": "separate", "value_clip": 0.1}))
    assert "value_coef" not in dump_toml(resolved.model_dump(mode="json"))
