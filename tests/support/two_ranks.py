"""Two-rank gloo groups for tests that spawn their ranks (`torch.multiprocessing.start_processes`)."""

from __future__ import annotations

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
    uses them (an abort at teardown otherwise, now and then)."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        yield
    finally:
        store.set(f"left/{rank}", "1")
        try:
            store.wait([f"left/{r}" for r in range(world_size)], TEARDOWN_TIMEOUT)
        finally:
            dist.destroy_process_group()
