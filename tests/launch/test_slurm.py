"""`rl --slurm.nodes N` writes an sbatch script instead of running: rendered for 1 and 3 nodes, it is valid
bash, places the inference server and the trainer nodes, sets the rendezvous, and every `rl` command in it
parses (with the job's variables filled in)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from prime_rl.configs.cli import parse_config
from prime_rl.launch.rl import launch
from prime_rl.launch.rl_config import RLConfig

JOB = {"$inference": "node0", "$head": "node1", "${nodes[$i]}": "node2"}


def rendered(tmp_path, nodes: int, *extra: str):
    config = parse_config(RLConfig, ["@", "examples/reverse_text/rl.toml", "--output-dir", str(tmp_path / "run"),
                                     "--slurm.nodes", str(nodes), *extra])
    launch(config)
    script = tmp_path / "run" / "slurm-job" / "rl.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert not (tmp_path / "run" / "configs").exists()  # nothing ran
    return script.read_text()


def words(line: str) -> list[str]:
    for variable, value in JOB.items():
        line = line.replace(variable, value)
    return shlex.split(line.rstrip(" &"))


def rl_config(line: str) -> RLConfig:
    argv = words(line)
    return parse_config(RLConfig, argv[argv.index("rl") + 1:])


def test_one_node_runs_everything_there(tmp_path):
    script = rendered(tmp_path, 1)
    assert "#SBATCH --nodes=1" in script
    (command,) = [line for line in script.splitlines() if line.startswith("srun")]
    config = rl_config(command)
    assert config.deployment.components == ["inference", "orchestrator", "trainer"] and config.slurm is None
    assert config.max_steps == 80 and config.orchestrator.batch_size == 512  # the example, resolved


def test_three_nodes_place_the_server_then_a_trainer_over_two_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIME_INFERENCE__API_KEY", "k" * 32)  # the job exports one for every node
    script = rendered(tmp_path, 3, "--slurm.gpus-per-node", "8", "--slurm.partition", "gpu", "--slurm.time",
                      "04:00:00", "--trainer.num-processes", "8")
    for header in ("--nodes=3", "--gpus-per-node=8", "--partition=gpu", "--time=04:00:00"):
        assert f"#SBATCH {header}" in script
    lines = [line.strip() for line in script.splitlines()]
    server, = [line for line in lines if line.startswith("srun") and '["inference"]' in line]
    head, = [line for line in lines if line.startswith("srun") and "orchestrator" in line]
    worker, = [line for line in lines if line.startswith("srun") and "torch.distributed.run" in line]
    s = rl_config(server)
    assert s.deployment.components == ["inference"] and s.inference.host == "0.0.0.0" and s.inference.port == 8000
    assert s.inference.allowed_hosts == ["node0"] and not s.overwrite
    h = rl_config(head)
    assert h.deployment.components == ["orchestrator", "trainer"]
    assert h.orchestrator.client.base_url == "http://node0:8000/v1"
    assert h.deployment.trainer_nodes == 2 and h.deployment.rdzv_endpoint == "node1:29500"
    argv = words(worker)
    assert "PRIMERL_RUN_LOCK_HELD=rl on node 1" in argv  # part of node 1's rl run, which holds the run lock
    assert "--nnodes=2" in argv and "--nproc-per-node=8" in argv and "--rdzv-endpoint=node1:29500" in argv
    assert argv[-2:] == ["@", str((tmp_path / "run" / "configs" / "trainer.toml").absolute())]
    assert "for i in $(seq 2 2); do" in script and script.rstrip().endswith("wait")
    assert "export PRIME_INFERENCE__API_KEY=" in script


@pytest.mark.parametrize("flag, value", [("--slurm.nodes", "0"), ("--slurm.time", "4h; rm -rf /"),
                                         ("--slurm.job-name", "a b")])
def test_bad_slurm_values_are_config_errors(flag, value, capsys):
    with pytest.raises(SystemExit) as caught:
        parse_config(RLConfig, [flag, value])
    assert caught.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_a_trainer_across_nodes_needs_the_rendezvous():
    with pytest.raises(Exception, match="trainer_nodes > 1 needs deployment.rdzv_endpoint"):
        RLConfig.build([], {"deployment": {"trainer_nodes": 2}})


@pytest.mark.parametrize("extra, words", [
    (["--inference.num-servers", "2"], "set inference.num_servers = 1"),
    (["--weight-transfer.mode", "distributed"], "weight_transfer.mode = 'filesystem'"),
])
def test_what_the_nodes_would_refuse_is_refused_before_a_script_is_written(tmp_path, extra, words):
    from prime_rl.utils.errors import ConfigError

    config = parse_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--slurm.nodes", "2", *extra])
    with pytest.raises(ConfigError, match=words):
        launch(config)
    assert not (tmp_path / "run").exists()


def test_the_jobs_config_never_overwrites(tmp_path):
    rendered(tmp_path, 1, "--overwrite")
    assert "overwrite" not in (tmp_path / "run" / "slurm-job" / "rl.toml").read_text()
