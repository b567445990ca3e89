"""`python -m torch.distributed.run --nproc-per-node K -m tests.support.train_in_sequence A.toml B.toml ...`:
the RL trainer on each config in turn, in the same K ranks: one torchrun start (K torch imports) for several
multi-rank tests. The ranks keep one process group for all of them (`train` destroys it at its end, and a
second init under one torchrun rendezvous is not reliable), so each `train` finds it initialised and uses it."""

from __future__ import annotations

import sys

import torch.distributed as dist

import prime_rl.trainer.rl.train as rl_train
from prime_rl.configs.cli import parse_config
from prime_rl.trainer.config import TrainerConfig

if __name__ == "__main__":
    rl_train.destroy = lambda: None  # the group outlives each run; destroyed once below
    for path in sys.argv[1:]:
        rl_train.train(parse_config(TrainerConfig, ["@", path]))
        dist.barrier()
    dist.destroy_process_group()
