"""Where the ranks come from: Slurm host lists, and torchrun / srun / Kubeflow / an existing process group."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from llmfoundry.core.dist import launcher_environment, rendezvous_port
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.hostlist import expand_counts, expand_hostlist


@pytest.mark.parametrize("text, hosts", [
    ("node[07-08,10]", ["node07", "node08", "node10"]),
    ("gpu1", ["gpu1"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("ip-10-0-0-[5,7]", ["ip-10-0-0-5", "ip-10-0-0-7"]),
])
def test_hostlists_expand_as_slurm_expands_them(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]"])
def test_malformed_hostlists_are_errors(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_task_counts_expand():
    assert expand_counts("2(x2)") == [2, 2]
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError):
        expand_counts("2(3)")


SRUN_TASK = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "4242"}


def test_an_srun_task_becomes_a_rank_with_the_first_host_as_master():
    source, env = launcher_environment(SRUN_TASK)
    assert source == "slurm"
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "node07", "MASTER_PORT": str(rendezvous_port(4242))}


def test_torchrun_variables_win_over_slurm_and_kubeflow():
    environ = {**SRUN_TASK, "PET_NNODES": "2", "PET_NODE_RANK": "1", "RANK": "0", "WORLD_SIZE": "2"}
    assert launcher_environment(environ) == ("torchrun", {})


def test_the_batch_shell_is_not_a_task():
    """sbatch's shell has SLURM_PROCID=0 but no step: it must not wait for a process group of SLURM_NTASKS."""
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "vm", "SLURM_JOB_ID": "1"}
    assert launcher_environment(environ) == ("none", {})


def test_kubeflow_pet_variables_for_one_process_per_pod():
    environ = {"PET_NNODES": "1:3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "job-0",
               "PET_MASTER_PORT": "29400"}
    assert launcher_environment(environ) == ("kubeflow", {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                                                          "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "job-0",
                                                          "MASTER_PORT": "29400"})
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE: 8 processes per pod need torchrun"):
        launcher_environment({**environ, "PET_NPROC_PER_NODE": "8"})


def test_two_srun_style_processes_train_together_without_torchrun(tmp_path):
    """Two processes with only Slurm's variables (as `srun -n2 python ...` starts them) form one process group."""
    code = textwrap.dedent("""
        import torch
        from llmfoundry.core import dist
        info = dist.init_distributed(60)
        total = dist.all_reduce_sum(torch.tensor([float(info.rank + 1)]))
        print(info.rank, info.world_size, info.local_rank, int(total.item()))
        dist.destroy()
    """)
    port = str(29000 + os.getpid() % 1000)
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update({"SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": str(rank),
                    "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
                    "SLURM_JOB_ID": "7", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True))
    outputs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert outputs == ["0 2 0 3", "1 2 1 3"]


def test_an_existing_process_group_is_used_as_it_is(tmp_path):
    code = textwrap.dedent(f"""
        import datetime, torch, torch.distributed as d
        d.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        from llmfoundry.core import dist
        info = dist.init_distributed(60)
        print(info.rank, info.world_size, d.is_initialized())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "True"]
