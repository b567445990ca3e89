"""Two-rank gloo groups for tests that spawn their ranks (`torch.multiprocessing.start_processes`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

TEARDOWN_TIMEOUT = timedelta(seconds=60)


@contextmanager
def gloo_rank(rank: int, store_path: str, world_size: int = 2) -> Iterator[None]:
    """This spawned process as `rank` of a gloo group over a FileStore at `store_path` (a file in the test's own
    tmp_path: no port to collide with another test's). Teardown cannot race: on the way out every rank passes a
    barrier on the store before any destroys the group, so no rank closes its connections while another still
    uses them (an abort at teardown otherwise, now and then). And the group goes before the interpreter does: what
    the block made on it (an FSDP model's device mesh holds the group, and modules hold reference cycles) is
    collected first, so the gloo group is not destroyed by the garbage collector while the interpreter finalizes
    (torch's gloo threads can abort the process then: SIGABRT, "terminate called without an active exception").
    A block keeps such objects in a function it calls, not in its own variables, which outlive the block."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        yield
    finally:
        gc.collect()
        store.set(f"left/{rank}", "1")
        try:
            store.wait([f"left/{r}" for r in range(world_size)], TEARDOWN_TIMEOUT)
        finally:
            dist.destroy_process_group()
