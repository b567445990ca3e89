"""A server's end of the torch.distributed weight transfer (`weight_transfer.py`): the builtin server, and
each vLLM worker (`vllm/worker.py`).

A thread joins the trainer's group at start (rank `weight_transfer.rank`) and receives every broadcast.
Each update is staged by the server's `stage_tensors(tensors, source)`: checked like a weight directory
(`weight_check.verify_tensors`: names, shapes, dtypes against the served model, finite values, tied tensors
equal; the builtin `Engine` also casts to the served dtype and refuses values that would overflow), then
held as the newest staged update; nothing changes the served model there. `POST /update_weights` with a
marker directory (`weights/step_N/transfer.json`) waits for a staged update of step >= N and applies it
under the weight gate like any update (builtin: drain, or in flight; vLLM: drain), so the served step is
the staged one. An update that fails its checks is logged and dropped (the previous one stays staged);
the thread ends when the trainer's group goes away (the run ended).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.utils.errors import UserError, first_line
from prime_rl.utils.logging import get_logger
from prime_rl.weight_transfer import open_group, receive

log = get_logger("inference")


class TransferTimeout(UserError):
    """No update of the asked step arrived in time."""


class TransferReceiver:
    """Receives the trainer's updates in a thread; `take(step, timeout_s)` hands out the newest staged one.

    `engine` has a `device` (where the group's buffers live: a GPU means NCCL) and `stage_tensors`."""

    def __init__(self, config: WeightTransferConfig, engine):
        self.config = config
        self.engine = engine
        self.staged: tuple[int, Any] | None = None  # (step, what stage_tensors made of it)
        self.error: str | None = None  # why the thread stopped, when it did
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="weight-transfer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c = self.config
        device = torch.device(self.engine.device)
        try:
            if device.type == "cuda":  # pragma: no cover - GPU only; a new thread starts on device 0
                torch.cuda.set_device(device)
            group = open_group(c.address, c.rank, c.world_size, c.timeout_s, device)
            log.info(f"joined the trainer's weight transfer group at {c.address} as rank {c.rank} of {c.world_size}")
            while True:
                step, tensors = receive(group, device)
                try:
                    staged = self.engine.stage_tensors(tensors, f"weight transfer of step {step}")
                except Exception as exc:  # the stream is intact (the update was received whole): go on
                    log.error(f"dropped the transferred weights of step {step}: {first_line(exc)}")
                    continue
                with self._ready:
                    self.staged = (step, staged)
                    self._ready.notify_all()
        except Exception as exc:  # the trainer's group went away (the run ended) or never came
            with self._ready:
                self.error = first_line(exc)
                self._ready.notify_all()
            log.info(f"weight transfer stopped ({self.error})")

    def newest(self) -> tuple[int, str | None]:
        """Without waiting: the newest staged update's step (-1: none yet) and why the thread stopped (None:
        it still receives)."""
        with self._ready:
            return (self.staged[0] if self.staged is not None else -1), self.error

    def release(self, step: int) -> None:
        """Drop the staged tensors of `step` once they are loaded (its step stays the newest staged)."""
        with self._ready:
            if self.staged is not None and self.staged[0] == step:
                self.staged = (step, None)

    def take(self, step: int, timeout_s: float) -> tuple[int, Any]:
        """The newest staged update, once its step is >= `step` (at most `timeout_s`): (its step, it)."""
        deadline = time.monotonic() + timeout_s
        with self._ready:
            while self.staged is None or self.staged[0] < step:
                left = deadline - time.monotonic()
                if self.error is not None or left <= 0:
                    raise TransferTimeout(f"no weights of step >= {step} arrived over the transfer group "
                                          f"({self.error or f'waited {timeout_s:g}s'})")
                self._ready.wait(left)
            return self.staged
