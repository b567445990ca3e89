"""`rl --slurm.nodes N`: write an sbatch script that runs this rl config on N nodes, instead of running it.

    1 node     every component on the node: `rl @ rl.toml`
    N >= 2     node 0: the inference server (`deployment.components = ["inference"]`, bound to 0.0.0.0);
               node 1: orchestrator + trainer (`["orchestrator", "trainer"]`), the first of N - 1 trainer
               nodes (`deployment.trainer_nodes`, torchrun's c10d rendezvous on node 1);
               nodes 2..N-1: torchrun joining that rendezvous with the trainer config node 1's rl writes

All nodes share `output_dir` (a shared filesystem) and one API key (PRIME_INFERENCE__API_KEY, generated
in the job unless set). The script and the resolved config it runs (`rl.toml`, without the `[slurm]`
section) go to `slurm.dir` (default `<output_dir>/slurm-job/`); `sbatch <script>` submits it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from prime_rl import run_lock
from prime_rl.configs.toml_io import write_toml
from prime_rl.launch.rl_config import RLConfig
from prime_rl.run_dir import SLURM_CONFIG, SLURM_SCRIPT, config_file, slurm_dir
from prime_rl.utils.errors import ConfigError


class Expand(str):
    """A shell word that expands the job's variables (`$inference`, `$head`, ...): double-quoted."""


def quoted(arg: str) -> str:
    """One shell word: single-quoted (taken literally), or double-quoted for an `Expand`."""
    if isinstance(arg, Expand):
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
    return shlex.quote(arg)


def line(*args: str) -> str:
    return " ".join(quoted(a) for a in args)


def render(config: RLConfig, config_path: Path) -> str:
    """The sbatch script running `config_path` (the resolved config) as `config.slurm` places it."""
    slurm = config.slurm
    rl = ["uv", "run", "rl", "@", str(config_path)]
    head = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={slurm.job_name}",
        f"#SBATCH --nodes={slurm.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f'#SBATCH --output="{Path(slurm.dir or slurm_dir(config.output_dir)).absolute()}/%j.out"',
        *([f"#SBATCH --gpus-per-node={slurm.gpus_per_node}"] if slurm.gpus_per_node else []),
        *([f"#SBATCH --partition={slurm.partition}"] if slurm.partition else []),
        *([f"#SBATCH --time={slurm.time}"] if slurm.time else []),
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
    ]
    if slurm.nodes == 1:
        return "\n".join([*head, line("srun", "--nodes=1", "--ntasks=1", *rl)]) + "\n"
    trainer_nodes = slurm.nodes - 1
    endpoint = Expand(f"$head:{slurm.rdzv_port}")
    trainer_config = str(config_file(config.output_dir, "trainer").absolute())
    # The other trainer nodes are part of node 1's rl run, which holds the run lock (run_lock.py).
    worker = ["env", f"{run_lock.HELD_BY_PARENT_ENV}=rl on node 1",
              "uv", "run", "python", "-m", "torch.distributed.run", f"--nnodes={trainer_nodes}",
              f"--nproc-per-node={config.trainer.num_processes}", "--rdzv-backend=c10d",
              Expand(f"--rdzv-endpoint={endpoint}"),
              "--rdzv-id=prime-rl-trainer", "-m", "prime_rl.trainer.rl.train", "@", trainer_config]
    on = ["srun", "--nodes=1", "--ntasks=1"]
    return "\n".join([
        *head,
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'inference=${nodes[0]}',
        'head=${nodes[1]}',
        "export PRIME_INFERENCE__API_KEY=${PRIME_INFERENCE__API_KEY:-$(python3 -c "
        "'import secrets; print(secrets.token_urlsafe(32))')}",
        line("rm", "-f", trainer_config) + "  # the trainer nodes wait for node 1's rl to write it anew",
        "# node 0: the inference server; it ends when the trainer has logged its last step",
        line(*on, Expand("--nodelist=$inference"), *rl, "--deployment.components", '["inference"]', "--inference.host",
             "0.0.0.0", "--inference.port", str(slurm.inference_port), "--inference.allowed-hosts",
             Expand('["$inference"]'), "--overwrite", "false") + " &",
        "# nodes 2..N-1: trainer ranks joining node 1's rendezvous, once node 1's rl has written their config",
        f"for i in $(seq 2 {slurm.nodes - 1}); do",
        "    " + line(*on, Expand("--nodelist=${nodes[$i]}"), "bash", "-c",
                      'until [ -f "$1" ]; do sleep 2; done; shift; exec "$@"', "wait-for-config", trainer_config,
                      *worker) + " &",
        "done",
        "# node 1: orchestrator and the first trainer node; the job ends with it",
        line(*on, Expand("--nodelist=$head"), *rl, "--deployment.components", '["orchestrator", "trainer"]',
             "--orchestrator.client.base-url", Expand(f"http://$inference:{slurm.inference_port}/v1"),
             "--deployment.trainer-nodes", str(trainer_nodes), "--deployment.rdzv-endpoint", endpoint),
        "wait",
    ]) + "\n"


def check(config: RLConfig) -> None:
    """What the nodes' `rl` would refuse, refused before a script is written (ConfigError, one line)."""
    if config.slurm.nodes < 2:
        return
    if config.inference.num_servers > 1:
        raise ConfigError("slurm.nodes >= 2 runs one inference server on node 0: set inference.num_servers = 1")
    if config.teacher is not None and config.teacher.base_url is None:
        raise ConfigError("slurm.nodes >= 2 starts no teacher server: give teacher.base_url")
    if config.weight_transfer.mode == "distributed":
        raise ConfigError("slurm.nodes >= 2 moves weights through the shared filesystem: weight_transfer.mode = "
                          "'filesystem'")


def write_script(config: RLConfig) -> Path:
    """Write the resolved config (without `[slurm]` and `overwrite`: a requeued job must not delete its run) and
    the sbatch script running it; returns the script."""
    check(config)
    directory = Path(config.slurm.dir or slurm_dir(config.output_dir)).absolute()
    config_path = directory / SLURM_CONFIG
    recorded = config.recorded()
    del recorded["slurm"]
    write_toml(config_path, recorded)
    script = directory / SLURM_SCRIPT
    script.write_text(render(config, config_path))
    script.chmod(0o755)
    return script
