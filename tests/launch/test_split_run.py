"""A split run (`deployment.components`): one `rl` starts only the inference server (a server node), another
the orchestrator and trainer against it, on one shared output dir, as two nodes would; here both on this
machine. The run trains, the server node's `rl` ends by itself when the trainer has logged its last step,
and each side keeps to its part of the run directory."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from prime_rl import run_lock
from prime_rl.utils.net import free_port
from tests.support.entrypoints import run_entrypoint
from tests.support.rl_runs import rows_by_source

pytestmark = [pytest.mark.slow]

SMALL = ["--model.name", "tiny-reverse-text", "--max-steps", "3", "--seq-len", "256", "--orchestrator.batch-size",
         "16", "--orchestrator.rollouts-per-example", "4", "--orchestrator.sampling.max-tokens", "8",
         "--wandb.mode", "disabled"]


def rl(*args: str) -> list[str]:
    return [sys.executable, "-m", "prime_rl.launch.rl", *SMALL, *args]


def test_a_server_node_and_a_trainer_node_run_one_rl_run(tmp_path):
    run, port = tmp_path / "run", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")} | {"PRIME_INFERENCE__API_KEY": "k" * 32}
    server = subprocess.Popen(rl("--output-dir", str(run), "--deployment.components", '["inference"]',
                                 "--inference.port", str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        trainer = subprocess.run(rl("--output-dir", str(run), "--deployment.components", '["orchestrator", "trainer"]',
                                    "--orchestrator.client.base-url", f"http://127.0.0.1:{port}/v1"),
                                 capture_output=True, text=True, env=env, timeout=600)
        assert trainer.returncode == 0, (trainer.stdout + trainer.stderr)[-3000:]
        out, _ = server.communicate(timeout=60)  # ends by itself: the trainer logged step max_steps - 1
    finally:
        server.kill()
    assert server.returncode == 0, out[-3000:]
    assert sorted(rows_by_source(run, "trainer")) == sorted(rows_by_source(run, "orchestrator")) == [0, 1, 2]
    node = run / "nodes" / socket.gethostname()
    assert sorted(p.name for p in (run / "configs").iterdir()) == ["orchestrator.toml", "rl.toml", "trainer.toml"]
    assert [p.name for p in (node / "configs").iterdir()] == ["inference.toml"]
    served = (node / "logs" / "inference.log").read_text()
    # it loaded the trainer's update (step 1, or straight step 2 when the orchestrator found both: it takes the newest)
    assert re.search(r"serving weights step [12] from \S+/weights/step_[12] ", served), served[-2000:]


@pytest.mark.parametrize("args, words", [
    (["--deployment.components", '["orchestrator", "trainer"]'], "orchestrator.client.base_url: the inference server "
                                                                 "runs elsewhere"),
    (["--deployment.components", '["inference"]'], "inference.port: the orchestrator runs elsewhere"),
    (["--deployment.components", '["inference"]', "--inference.port", "8000"], "one API key in every rl"),
    (["--deployment.components", '["trainer"]'], "a split run is one rl with ['inference']"),
    (["--deployment.components", '["inference", "inference"]'], "at most once"),
    (["--deployment.components", "[]"], "at least one"),
])
def test_a_split_that_cannot_work_is_one_line_exit_2(tmp_path, args, words):
    result = run_entrypoint("rl", "--output-dir", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_trainer_across_two_nodes_joins_one_rendezvous(tmp_path):
    """Three "nodes" on this machine, as the SLURM script places them (launch/slurm.py): a server, the head (rl:
    orchestrator + the first trainer node) and a second trainer node (torchrun joining the c10d rendezvous with
    the trainer config the head's rl writes). One trainer of 2 ranks trains; the orchestrator deals to both."""
    run, port, rdzv = tmp_path / "run", free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")} | {"PRIME_INFERENCE__API_KEY": "k" * 32}
    server = subprocess.Popen(rl("--output-dir", str(run), "--deployment.components", '["inference"]',
                                 "--inference.port", str(port)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    trainer_config = run / "configs" / "trainer.toml"
    worker = subprocess.Popen(["bash", "-c", 'until [ -f "$1" ]; do sleep 0.5; done; shift; exec "$@"', "wait",
                               str(trainer_config), sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                               "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv}",
                               "--rdzv-id=prime-rl-trainer", "-m", "prime_rl.trainer.rl.train", "@",
                               str(trainer_config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env | {"OMP_NUM_THREADS": "1", run_lock.HELD_BY_PARENT_ENV: "rl on node 1"})
    try:
        head = subprocess.run(rl("--output-dir", str(run), "--deployment.components", '["orchestrator", "trainer"]',
                                 "--orchestrator.client.base-url", f"http://127.0.0.1:{port}/v1",
                                 "--deployment.trainer-nodes", "2", "--deployment.rdzv-endpoint",
                                 f"127.0.0.1:{rdzv}"), capture_output=True, text=True, env=env, timeout=600)
        assert head.returncode == 0, (head.stdout + head.stderr)[-3000:]
        worker_out, _ = worker.communicate(timeout=120)
        server.wait(timeout=60)
    finally:
        worker.kill()
        server.kill()
    assert server.returncode == 0 and worker.returncode == 0, worker_out[-3000:]
    assert sorted(rows_by_source(run, "trainer")) == [0, 1, 2]
    written = sorted(p.name for p in (run / "rollouts" / "step_2").iterdir())
    assert written == ["rank_0.pt", "rank_1.pt", "samples.jsonl", "token_outcomes_rank_0.jsonl",
                       "token_outcomes_rank_1.jsonl"]  # each trainer rank records the samples it trained
    assert "trainer_world_size = 2" in (run / "configs" / "orchestrator.toml").read_text()
