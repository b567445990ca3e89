"""Configs of the `trainer` (RL) entrypoint and of what `sft` shares with it (`TrainingConfig`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from prime_rl.configs.advantage import AdvantageConfig, GrpoAdvantageConfig
from prime_rl.configs.base import NONE, BaseConfig
from prime_rl.configs.loss import DefaultLossConfig, LossConfig
from prime_rl.configs.shared import ASYNC_LEVEL_DEFAULT, AsyncLevel, CkptConfig, RunConfig, WeightTransferConfig
from prime_rl.utils.errors import ConfigError

if TYPE_CHECKING:
    from prime_rl.configs.layers import Layer

Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimConfig(BaseConfig):
    """AdamW and gradient clipping."""

    lr: Annotated[float, Field(gt=0)] = 3e-4
    """Peak learning rate."""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW betas (beta1, beta2), each in [0, 1): the decay rates of the moment averages."""
    eps: Annotated[float, Field(gt=0)] = 1e-8
    """AdamW epsilon."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW decoupled weight decay."""
    max_norm: Annotated[float, Field(gt=0)] | None = 1.0
    """Clip the global gradient norm to this value (none: no clipping)."""


class SchedulerConfig(BaseConfig):
    """Learning-rate schedule over `max_steps`."""

    type: Literal["constant", "linear", "cosine"] = "constant"
    """constant: lr after warm-up; linear / cosine: decay to min_lr_ratio * lr at the last step."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Linear warm-up from 0 to lr over this many steps."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Final lr as a fraction of lr (linear and cosine)."""


class RuntimeConfig(BaseConfig):
    """How the trainer runs the model."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter dtype: auto is float32 on CPU and bfloat16 (mixed precision) on GPU."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """Attention kernel (flash_attention_2 needs the flash-attn package)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward to save memory."""
    compile: bool = False
    """torch.compile each decoder layer."""
    deterministic: bool = False
    """Use deterministic torch kernels (slower; for bit-exact resume tests)."""
    threads: Annotated[int, Field(gt=0)] | None = None
    """Torch CPU threads per rank (torch.set_num_threads; none: one per core); leave the inference server a core."""


class ModelInitConfig(BaseConfig):
    """Build the model from an architecture with random weights instead of loading model.name's weights."""

    config: str | None = None
    """A Hugging Face config (directory with config.json, or the JSON file); none: a tiny Qwen3 sized for the
    tokenizer."""
    tokenizer: str = "char"
    """Tokenizer directory, or 'char' for the built-in character-level tokenizer with a ChatML template."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Config fields to override, e.g. {hidden_size = 128, num_hidden_layers = 4}."""


def settle_init(layers: Sequence[Layer]) -> tuple[dict[str, Any], list[str]]:
    """Where the model starts when layers disagree: `model.name` (its weights) or `[init]` (random weights).

    The later layer wins (`configs.layers`: TOML files in order, the files each includes before it, the PRIME_*
    variables, the command line): `sft @ sft.toml --model.name DIR` drops the file's [init]; [init] after a
    model.name leaves it unused. Either way one notice names what is ignored. One layer setting both is a
    ConfigError, whatever later layers say, as `configs.cli.check_layers` judges a file's values on their own
    (a resolved config does not write model.name beside [init]). `init = "none"` is no [init].
    """
    for layer in layers:
        if layer.sets("model.name") and layer.sets("init") and layer.get("init") not in (None, NONE):
            raise ConfigError(f"model.name and [init] both come from {layer.where}: keep one (model.name loads that "
                              "model's weights, [init] builds a random model)")
    named = [i for i, layer in enumerate(layers) if layer.sets("model.name")]
    inits = [i for i, layer in enumerate(layers) if layer.sets("init")]
    if not named or not inits or layers[inits[-1]].get("init") in (None, NONE):
        return {}, []
    name, init = layers[named[-1]], layers[inits[-1]]
    if named[-1] > inits[-1]:
        return {"init": None}, [f"{name.spell('model.name')} given: ignoring [init] from {init.where}"]
    return {}, [f"[init] from {init.where} builds a random model: ignoring {name.spell('model.name')}"]


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAConfig(BaseConfig):
    """LoRA (peft): train low-rank adapters on frozen base weights, W = W0 + (alpha / rank) * B @ A.

    Only A [rank, in] and B [out, rank] of each targeted linear layer are trained (B starts at 0,
    so step 0 is the base model), plus the weights of `modules_to_save` in full; weights/step_N holds
    the adapter (and those weights), or merged full weights with `merge`.
    """

    rank: Annotated[int, Field(ge=1)] = 8
    """Rank r of each adapter (A is [r, in_features], B is [out_features, r])."""
    alpha: Annotated[float, Field(gt=0)] = 16.0
    """Scale numerator: the adapter adds (alpha / rank) * B @ A to each targeted weight."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on each adapter's input (sft only: the RL trainer runs with dropout off, see docs/trainer.md#lora)."""
    target_modules: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: list(LORA_TARGETS))
    """Linear layers to adapt, by name or name suffix inside the decoder layers (peft's target_modules); each must
    match a layer."""
    modules_to_save: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Modules trained in full beside the adapters and shipped with them (peft's modules_to_save, matched as peft
    does: by name suffix, so "norm" is every RMSNorm); see docs/trainer.md#lora."""
    merge: bool = False
    """Publish merged full weights (W0 + scale * B @ A) to weights/step_N instead of the adapter (any backend, no
    LoRA support needed)."""


class TrainingConfig(RunConfig):
    """What every training entrypoint (`trainer`, `sft`) has: the optimizer, its schedule, checkpoints, how
    the model runs, and the weights it writes (`trainer/session.py` runs all of it)."""

    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""
    ckpt: CkptConfig = Field(default_factory=CkptConfig)
    """Checkpointing and resume."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """dtype, attention kernel, activation checkpointing, compile."""
    keep_weights: Annotated[int, Field(ge=1)] | None = 3
    """Keep only the newest this many weights/step_N directories (none: keep all)."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters instead of every weight (none: full fine-tuning); see docs/trainer.md#lora."""


class CriticConfig(BaseConfig):
    """The critic of the `gae` advantage type: the value function V the trainer learns with a clipped value loss,
    of one of two kinds (`type`): a separate model (the policy's architecture with a one-output token-classification
    head; `trainer/critic.py`, `SeparateCritic`) or a value head on the policy's own final hidden states
    (`trainer/value_head.py`, `ValueHeadCritic`); see docs/losses.md#ppo-with-a-critic-gae."""

    type: Literal["separate", "value_head"] = "separate"
    """separate: a second model with its own forward and backward; value_head: a linear head on the policy's own
    final hidden states, trained in the policy's backward (the trunk learns from the value loss too;
    docs/losses.md#ppo-with-a-critic-gae)."""
    model: Annotated[str, Field(min_length=1)] | None = None
    """Where the separate critic starts: a local model directory (its decoder weights; the head is new, seeded);
    none: the policy's model.name. Not with type value_head."""
    value_coef: Annotated[float, Field(gt=0)] | None = None
    """value_head only: the weight of the value loss in the joint loss (none: 0.1)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """The critic's own AdamW (constant lr) and gradient clipping (value_head: the head's; the trunk steps with the
    policy's optim)."""
    value_clip: Annotated[float, Field(gt=0)] | None = 0.2
    """Clip the new value to V_old +- this in the value loss (PPO's value clipping); none: plain squared error."""

    @property
    def value_loss_coef(self) -> float:
        """c_V of the joint loss (value_head): `value_coef`, or 0.1 when unset."""
        return self.value_coef if self.value_coef is not None else 0.1


class TrainerConfig(TrainingConfig):
    """RL trainer: reads rollout batches, steps the policy with the configured loss, writes weights."""

    command = "trainer"
    run_lock = "shared"

    loss: LossConfig = Field(default_factory=DefaultLossConfig)
    """Policy loss (see docs/losses.md)."""
    match_truncation: bool = True
    """Score tokens under the sampler's truncation (the batch's top_k, top_p, min_p applied to the trainer's own
    logits, renormalised), so the importance ratio is exactly 1 on-policy; false: the full softmax, whose ratio is
    wrong on every token whenever the sampler truncates (see docs/losses.md, "Truncated sampling")."""
    sampled_vocab: Literal["tokenizer", "model"] = "tokenizer"
    """The ids the inference server samples from, which the trainer scores over: "tokenizer" (the builtin server:
    never an output row past the tokenizer's ids, e.g. Qwen3's 267 padded rows) or "model" (vLLM: every row of
    the output embedding). `rl` sets it from inference.backend; see docs/inference.md, "Padded vocabularies"."""
    advantage: AdvantageConfig = Field(default_factory=GrpoAdvantageConfig)
    """The advantage type (`rl` hands down orchestrator.advantage): what the trainer computes before the loss is
    its `trainer_step` (`configs/advantage.py`)."""
    critic: CriticConfig | None = None
    """The critic of advantage type "gae" (none there: the defaults); only "gae" uses one."""
    update_epochs: Annotated[int, Field(ge=1)] = 1
    """Optimizer steps per rollout batch (each a full pass; the ratio stays against the inference logprobs, or
    against the policy before the first pass under `[loss.correction] old_logprobs = "trainer"`)."""
    batch_timeout_s: Annotated[float, Field(gt=0)] = 3600.0
    """How long to wait for a rollout batch rollouts/step_N/ before giving up."""
    max_async_level: AsyncLevel = ASYNC_LEVEL_DEFAULT
    """The orchestrator's max_async_level (`rl` hands it down): step N trains only samples with
    N - this <= policy_step <= N."""
    weight_transfer: WeightTransferConfig = Field(default_factory=WeightTransferConfig)
    """How the weights reach the inference servers (rl hands it down): filesystem or a torch.distributed broadcast."""
    num_processes: Annotated[int, Field(ge=1)] = 1
    """Trainer ranks: `rl` runs `torchrun --nproc-per-node num_processes` when > 1 (one GPU each, or CPU/gloo)."""

    @property
    def critic_in_use(self) -> CriticConfig | None:
        """The critic this run trains: [critic] (its defaults when absent) under advantage type "gae", else none.
        `critic` is the section as written (none also under "gae"); this is what the trainer builds."""
        return (self.critic or CriticConfig()) if self.advantage.uses_critic else None

    def check_consistency(self, prefix: str = "") -> None:
        if self.loss.correction.old_logprobs == "current" and self.update_epochs > 1:
            raise ValueError(f"{prefix}loss.correction.old_logprobs = 'current' takes each pass's own policy as "
                             f"pi_old, so with update_epochs = {self.update_epochs} nothing bounds the later passes: "
                             "use old_logprobs = 'trainer' (decoupled PPO)")
        if self.weight_transfer.mode == "distributed" and self.lora is not None and not self.lora.merge:
            raise ValueError(f"{prefix}weight_transfer.mode = 'distributed' sends full weights: with lora set "
                             "lora.merge = true (or use the filesystem)")
        if self.critic is not None and not self.advantage.uses_critic:
            raise ValueError(f"{prefix}critic is used only by an advantage type with a critic, such as 'gae' (the "
                             f"advantage type is {self.advantage.type!r})")
        critic = self.critic
        if critic is not None and critic.type == "separate" and critic.value_coef is not None:
            raise ValueError(f"{prefix}critic.value_coef weights the value loss in the policy's loss, which only "
                             "critic.type = 'value_head' has (the separate critic has its own loss)")
        if critic is not None and critic.type == "value_head" and critic.model is not None:
            raise ValueError(f"{prefix}critic.model is where a separate critic starts: a value head sits on the "
                             "policy itself (critic.type = 'value_head')")
