"""What `trainer` and `sft` share: process group, model, optimizer, scheduler, resume,
the optimizer step with its NaN guard, weight writing, checkpoints and metrics. It knows no RL: what only the RL
trainer has (the sampled vocabulary, a weight-transfer group, a critic) it is given by its caller.

A training step of either entrypoint is: forward/backward every micro-batch (each loss
already normalised over the whole step, so gradients accumulate to the step's gradient),
then `optimizer_step` (clip, check loss and norm finite, AdamW, check parameters finite),
the lr schedule, then `after_step` (weights, checkpoint, metrics).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from prime_rl.configs.base import config_data
from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.models.vocabulary import tokenizer_vocab
from prime_rl.monitor import Monitor
from prime_rl.run_dir import log_file, resolve_resume_step, weights_dir
from prime_rl.trainer import trainer_ckpt as ckpt_io
from prime_rl.trainer.config import ModelInitConfig, TrainingConfig
from prime_rl.trainer.critic import Critic
from prime_rl.trainer.dist import all_reduce_sum, init_distributed
from prime_rl.trainer.lora import LoRAWeights, apply_lora, base_fingerprint, checkpoint_identity
from prime_rl.trainer.model import load_model, load_tokenizer, prepare_model
from prime_rl.trainer.optim import build_optimizer, build_scheduler, checked_step
from prime_rl.trainer.perf import flops_per_token, num_parameters, throughput_metrics
from prime_rl.trainer.publish_weights import send_weights, write_weights
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import setup_logging
from prime_rl.weight_transfer import open_group


class TrainSession:
    """Owns the distributed model, its optimizer and scheduler for one `trainer` / `sft` run.

    `config` is the shared part of a `TrainerConfig` or an `SFTConfig` (`TrainingConfig`).
    `start_step` is the number of optimizer steps already done (from a resumed checkpoint).
    `dropout`: whether the model's dropout layers (LoRA's included) are active in training forwards
    (`sft`: yes; the RL trainer: no, its logprobs must be the sampling policy's, docs/trainer.md#lora).
    With `config.lora` the model is the base with peft's LoRA layers injected; only the adapters train.
    `sampled_vocab`: the ids the inference server samples ("tokenizer": the tokenizer's; "model": every row of the
    output embedding; `models.vocabulary`). `transfer`: how weights reach the servers (none: files only).
    `critic`: builds the critic from this session once the policy exists (`critic.Critic`); the session then
    owns it, checkpoints it with the policy and restores it on resume.
    """

    def __init__(self, config: TrainingConfig, source: str, init: ModelInitConfig | None = None, *,
                 dropout: bool, sampled_vocab: Literal["tokenizer", "model"] = "tokenizer",
                 transfer: WeightTransferConfig | None = None,
                 critic: Callable[[TrainSession], Critic] | None = None):
        self.config = config
        self.source = source
        self.dist = init_distributed()
        self.output_dir = Path(config.output_dir)
        self.log = setup_logging(source, log_file(self.output_dir, source) if self.dist.is_main else None)
        if config.runtime.threads is not None:
            torch.set_num_threads(config.runtime.threads)
        if config.runtime.deterministic:
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(config.seed + self.dist.rank)
        random.seed(config.seed + self.dist.rank)

        self.tokenizer = load_tokenizer(config.model, init)
        self.sampled_vocab = tokenizer_vocab(self.tokenizer) if sampled_vocab == "tokenizer" else None
        net = load_model(config.model, config.runtime, self.dist.device, init, self.tokenizer, seed=config.seed)
        self.lora = None
        if config.lora is not None:
            self.lora = LoRAWeights.of(apply_lora(net, config.lora, config.seed), config.lora)
        self.model_config = net.config
        self.num_params = num_parameters(net)
        self.model = prepare_model(net, config.runtime, self.dist.device)
        self.model.train(dropout)
        fingerprint = base_fingerprint(self.model, self.dist.device) if config.lora is not None else None
        self.identity = checkpoint_identity(config.lora, fingerprint)  # what the checkpoints trained
        self.optimizer = build_optimizer(self.model, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.scheduler, config.max_steps)
        self.critic = critic(self) if critic is not None else None
        if self.critic is not None:
            self.identity["critic"] = self.critic.config.type  # a resume must keep the kind of critic

        # weight_transfer.mode = "distributed": rank 0 joins the servers' group now (they join at their start).
        self.transfer_group = None
        if transfer is not None and transfer.mode == "distributed" and self.dist.is_main:
            if transfer.address is None:
                raise UserError("weight_transfer.mode = 'distributed' needs weight_transfer.address (rl sets it)")
            self.transfer_group = open_group(transfer.address, 0, transfer.world_size, transfer.timeout_s,
                                             self.dist.device)
        self.distributed_transfer = transfer is not None and transfer.mode == "distributed"

        self.start_step = 0
        self.resume_extra: dict = {}
        resume = resolve_resume_step(self.output_dir, config.ckpt.resume_step)
        if resume is not None:
            self.resume_extra = ckpt_io.load_checkpoint(self.output_dir, resume, self.model, self.optimizer,
                                                        self.scheduler, self.identity, self.critic)
            self.start_step = resume
            self.log.info(f"resumed from {ckpt_io.ckpt_dir(self.output_dir, resume)} (continuing at step {resume})")
        self.monitor = None
        if self.dist.is_main:
            self.monitor = Monitor(self.output_dir, source, config.wandb, config_data(config),
                                   resume_step=resume)
        self.log.info(f"{source}: {self.num_params / 1e6:.2f}M parameters on {self.dist.world_size} rank(s), "
                      f"device {self.dist.device}")

    # ------------------------------------------------------------------ step pieces

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's share of the global step loss.

        FSDP averages gradients over ranks; our losses are already global sums, so the
        loss is multiplied by the world size to make the reduced gradient their sum.
        """
        (loss * self.dist.world_size).backward()

    def optimizer_step(self, step: int, loss_value: float) -> float:
        """Clip, check the (all-reduced) loss and gradient norm are finite, step AdamW, check the
        updated parameters are finite (a damaged optimizer state can turn finite gradients into
        NaN weights); returns the norm.

        Raises `NonFiniteError` before `after_step`, so no weights or checkpoint of this step
        are ever written.
        """
        return checked_step(self.model, self.optimizer, self.config.optim.max_norm, loss_value,
                            f"{self.source} step {step}")

    def after_step(self, done: int, write: bool, extra: dict | None = None) -> None:
        """After `done` optimizer steps: write weights/step_{done} if `write`, checkpoint when due."""
        if write:
            self._write_weights(done)
        interval = self.config.ckpt.interval
        if done == self.config.max_steps or (interval is not None and done % interval == 0):
            ckpt_io.save_checkpoint(self.output_dir, done, self.model, self.optimizer, self.scheduler, extra,
                                    self.config.ckpt.keep, self.identity, self.critic)

    def _write_weights(self, step: int) -> None:
        """Collective: `weights/step_{step}` (or, with distributed transfer, the broadcast and its marker), keeping
        the newest `keep_weights`."""
        if self.distributed_transfer:
            send_weights(self.model, self.transfer_group, self.output_dir, step, self.dist.is_main, self.dist.device,
                         self.config.keep_weights, self.lora)
            return
        write_weights(self.model, self.tokenizer, self.output_dir, step, self.dist.is_main, self.config.keep_weights,
                      self.lora)

    def publish_resumed_weights(self) -> None:
        """After a resume from step N, make sure `weights/step_N` exists: the orchestrator needs
        weights >= N - max_async_level to generate step N, and retention (`keep_weights`) may
        have deleted them while the interrupted run went on past its checkpoint."""
        if self.start_step == 0:
            return
        # Every rank must agree (writing is a collective): rank 0's view decides. A marker of the distributed
        # transfer names weights that went to the previous run's servers: these get them again.
        missing = self.dist.is_main and (self.distributed_transfer
                                         or not weights_dir(self.output_dir, self.start_step).is_dir())
        (missing,) = all_reduce_sum([int(missing)], self.dist.device)
        if missing:
            self._write_weights(self.start_step)
            self.log.info(f"published the weights of step {self.start_step} again from the resumed checkpoint")

    def perf_metrics(self, tokens: int, step_time: float, avg_seq_len: float) -> dict[str, float]:
        """perf/* of one step; `tokens` counts this rank only (summed over ranks here)."""
        (total,) = all_reduce_sum([tokens], self.dist.device)
        fpt = flops_per_token(self.num_params, self.model_config, avg_seq_len)
        return throughput_metrics(int(total), step_time, fpt, self.dist.world_size, self.dist.device)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.monitor is not None:
            self.monitor.log(metrics, step)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
