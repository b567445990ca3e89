"""Seconds per weight update: through the filesystem against over torch.distributed (gloo on CPU).

    uv run python benchmarks/weight_transfer.py                    # tiny and 50m presets, 5 updates each
    uv run python benchmarks/weight_transfer.py --preset 50m --updates 3

For each preset of `benchmarks/trainer.py` the trainer's model (FSDP2, one rank, fp32) publishes
`--updates` updates to a builtin engine in a child process, each way (medians reported):

- filesystem: `write_weights` (gather the full state, write weights/step_N as safetensors) on the
  trainer, then `stage_weights` (read and check the directory) + `apply_weights` on the server;
- distributed: `send_weights` (gather, broadcast in buckets over the transfer group, write the marker)
  on the trainer, then `stage_tensors` (check, cast) + `apply_weights` on the server.

`update_s` = trainer side + server side: the time from the end of an optimizer step until the server
serves the new weights (the orchestrator's request around it is not counted).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from prime_rl.configs.shared import ModelConfig
from prime_rl.trainer.config import RuntimeConfig
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.model import load_model, load_tokenizer, prepare_model
from prime_rl.trainer.publish_weights import send_weights, write_weights
from prime_rl.utils.net import free_port
from prime_rl.weight_transfer import open_group, receive

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer import PRESETS, make_model  # noqa: E402 (benchmarks/trainer.py)


def server(model_dir: str, address: str, updates: int, conn) -> None:
    """The engine's side: `updates` directories to load, then `updates` transfers to receive; reports seconds."""
    from prime_rl.inference.builtin.engine import Engine

    engine = Engine(model_dir, context_len=64, seed=0, max_batch_size=1)
    times = {"filesystem": [], "distributed": []}
    for step in range(1, updates + 1):
        path = conn.recv()
        start = time.perf_counter()
        engine.apply_weights(engine.stage_weights(path), step)
        times["filesystem"].append(time.perf_counter() - start)
        conn.send("done")
    group = open_group(address, 1, 2, 600, torch.device("cpu"))
    for step in range(1, updates + 1):
        _, tensors = receive(group, torch.device("cpu"))
        start = time.perf_counter()
        engine.apply_weights(engine.stage_tensors(tensors, f"transfer {step}"), step)
        times["distributed"].append(time.perf_counter() - start)
    conn.send(times)
    engine.close()


def measure(name: str, updates: int) -> dict:
    preset = PRESETS[name]
    with tempfile.TemporaryDirectory(prefix=f"bench-transfer-{name}-") as tmp:
        tmp = Path(tmp)
        params = make_model(tmp / "model", preset)
        dist = init_distributed()
        model_config = ModelConfig(name=str(tmp / "model"))
        model = prepare_model(load_model(model_config, RuntimeConfig(), dist.device), RuntimeConfig(), dist.device)
        tokenizer = load_tokenizer(model_config)
        address = f"127.0.0.1:{free_port()}"
        ours, theirs = mp.Pipe()
        child = mp.get_context("spawn").Process(target=server, args=(str(tmp / "model"), address, updates, theirs))
        child.start()
        trainer = {"filesystem": [], "distributed": []}
        for step in range(1, updates + 1):
            start = time.perf_counter()
            path = write_weights(model, tokenizer, tmp / "fs", step, is_main=True, keep=1)
            trainer["filesystem"].append(time.perf_counter() - start)
            ours.send(str(path))
            ours.recv()
        group = open_group(address, 0, 2, 600, dist.device)
        for step in range(1, updates + 1):
            start = time.perf_counter()
            send_weights(model, group, tmp / "dist", step, True, dist.device, keep=1)
            trainer["distributed"].append(time.perf_counter() - start)
        served = ours.recv()
        child.join()
    result = {"preset": name, "params_M": round(params / 1e6, 2), "bytes_MB": round(4 * params / 1e6, 1)}
    for mode in ("filesystem", "distributed"):
        t, s = statistics.median(trainer[mode]), statistics.median(served[mode])
        result[mode] = {"trainer_s": round(t, 3), "server_s": round(s, 3), "update_s": round(t + s, 3)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["tiny", "50m"], action="append", help="repeatable; default: both")
    parser.add_argument("--updates", type=int, default=5)
    args = parser.parse_args()
    for name in args.preset or ["tiny", "50m"]:
        print(json.dumps(measure(name, args.updates)), flush=True)


if __name__ == "__main__":
    main()
