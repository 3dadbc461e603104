"""torch.distributed set-up from the launcher's environment; world size 1 needs no process group.

Where the ranks come from, first match wins: a process group that is already initialised (Ray Train, a notebook,
a test harness) is used as it is; torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); a task
that ``srun`` started directly (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID and the step's
node list, whose first host is the master); Kubeflow's ``PET_*`` variables for one process per pod. The last two
are written back as torchrun's variables, so the rest of the code reads one set of names.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmfoundry.core.errors import CollectiveError, ConfigError, first_line
from llmfoundry.core.hostlist import expand_counts, expand_hostlist

TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The process group's timeout when init_distributed made it (None: a group someone else made, with its own).
_timeout_s: float | None = None
_launcher_device: torch.device | None = None  # set by use_device()


def rendezvous_port(job_id: int | str) -> int:
    """A port derived from a Slurm job id, the same on every node of the job (the batch script computes it too),
    and different for jobs that share a node."""
    return 20000 + int(job_id) % 20000


def _int(environ: Mapping[str, str], key: str) -> int:
    try:
        return int(environ[key])
    except ValueError:
        raise ConfigError(f"{key}: '{environ[key]}' is not a whole number (the launcher set it wrongly)") from None


def launcher_environment(environ: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(the launcher's name, torchrun's variables for this process) read from ``environ``; ('none', {}) when no
    launcher describes several processes. torchrun's variables win over Slurm's and Kubeflow's."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return "torchrun", {}
    if "SLURM_PROCID" in environ and "SLURM_STEP_NUM_TASKS" in environ:  # a task of an srun step, not the batch shell
        nodes = expand_hostlist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", ""))
        if not nodes:
            raise ConfigError("SLURM_STEP_NODELIST: empty; cannot find the master host (start the job with srun)")
        return "slurm", {
            "RANK": str(_int(environ, "SLURM_PROCID")),
            "WORLD_SIZE": str(_int(environ, "SLURM_STEP_NUM_TASKS")),
            "LOCAL_RANK": str(_int(environ, "SLURM_LOCALID")) if "SLURM_LOCALID" in environ else "0",
            "LOCAL_WORLD_SIZE": str(_local_tasks(environ)),
            "MASTER_ADDR": environ.get("MASTER_ADDR", nodes[0]),
            "MASTER_PORT": environ.get("MASTER_PORT", str(rendezvous_port(environ.get("SLURM_JOB_ID", "0")))),
        }
    if "PET_NNODES" in environ and "PET_NODE_RANK" in environ:  # Kubeflow, without torchrun in the command
        per_node = environ.get("PET_NPROC_PER_NODE", "1")
        if per_node not in ("1", "auto") and per_node.isdigit() and int(per_node) > 1:
            raise ConfigError(f"PET_NPROC_PER_NODE: {per_node} processes per pod need torchrun as the container "
                              "command (llmfoundry k8s writes it); a plain python command runs one process per pod")
        nnodes = environ["PET_NNODES"].split(":")[-1]  # torchrun's elastic form MIN:MAX
        return "kubeflow", {
            "RANK": environ["PET_NODE_RANK"], "WORLD_SIZE": nnodes, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": environ.get("PET_MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": environ.get("PET_MASTER_PORT", "29500"),
        }
    return "none", {}


def _local_tasks(environ: Mapping[str, str]) -> int:
    counts = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if not counts:
        return 1
    per_node = expand_counts(counts)
    node = int(environ.get("SLURM_NODEID", "0"))
    return per_node[node] if node < len(per_node) else per_node[-1]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def use_device(device: torch.device | None) -> None:
    """The device chosen for this process by the launcher that made its process group (Ray Train's
    ``get_device()``, which knows the GPUs Ray gave the worker); init_distributed then uses it instead of
    cuda:LOCAL_RANK. None forgets it."""
    global _launcher_device
    _launcher_device = device


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Join the process group the launcher describes (gloo on CPU, nccl on CUDA) and pick this rank's device.

    ``timeout_s`` (the recipes' ``dist_timeout``) bounds every collective of a group made here, for torchrun,
    Slurm and Kubeflow alike. A group that already exists (Ray Train's, a caller's) keeps the timeout it was made
    with, which cannot be changed afterwards: Ray's is ``TorchConfig(timeout_s=...)``, 1800 s by default."""
    global _timeout_s
    if dist.is_initialized():  # someone else (Ray, a caller) made the group: use it as it is
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank % max(1, torch.cuda.device_count()))))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
    else:
        _, variables = launcher_environment(os.environ)
        os.environ.update(variables)  # later readers (LOCAL_RANK in checkpoint downloads, env://) see torchrun's names
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if _launcher_device is not None:
        device = _launcher_device
    elif torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        _timeout_s = timeout_s  # every collective of the group (ours, FSDP's, DCP's) fails after this long
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return DistInfo(rank, world_size, local_rank, device)


def new_gloo_group():
    """A gloo group of every rank (collective: every rank calls it at the same point) whose collectives fail after
    ``dist_timeout``, as the default group's do (torch's own default for a new group is 30 minutes)."""
    timeout = datetime.timedelta(seconds=_timeout_s) if _timeout_s is not None else None
    return dist.new_group(backend="gloo", timeout=timeout)


def collective_failure(op: str, error: BaseException) -> CollectiveError:
    """One line for a collective that failed: this rank, the operation, and whether it timed out or lost a peer."""
    text = str(error)
    where = f"rank {rank()} of {world_size()}"
    if "timed out" in text.lower() or "timeout" in text.lower():
        limit = f"dist_timeout={_timeout_s:g}s" if _timeout_s is not None else "the process group's timeout"
        what = (f"did not complete within {limit}: another rank stopped or is stuck before it (raise dist_timeout "
                "if a step can legitimately take longer)")
    else:
        what = "failed: another rank left the job"
    return CollectiveError(f"{where}: {op} {what} ({first_line(error)[:200]})")


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` (from anywhere in a run) came from the process group: a timeout or a lost peer."""
    if not dist.is_initialized() or isinstance(error, CollectiveError):
        return False
    text = str(error)
    return isinstance(error, dist.DistError) or any(mark in text for mark in (
        "gloo", "NCCL", "ProcessGroup", "Timed out waiting", "Connection reset by peer", "Connection closed by peer"))


@contextlib.contextmanager
def collective(op: str) -> Iterator[None]:
    """Run one collective named ``op``; its failure (a timeout, a peer gone) becomes a CollectiveError naming this
    rank and ``op``."""
    try:
        yield
    except RuntimeError as error:
        if not is_collective_failure(error):
            raise
        raise collective_failure(op, error) from None


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local part (this rank's shard; same storage), any other tensor as it is. Duck-typed: importing
    torch.distributed.tensor to check would cost ~0.7 s where no DTensor exists."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@dataclass(frozen=True)
class DataShare:
    """Which share of the data this rank's batches are: its data-parallel ``rank`` of ``size``. ``replication``
    consecutive ranks see the same batches: the ranks of one tensor-parallel group compute one microbatch
    together. The trainer makes one and hands it to the loaders, the ICL evaluator and the callbacks."""

    rank: int = 0
    size: int = 1
    replication: int = 1


def data_share(replication: int = 1) -> DataShare:
    """This process's DataShare when ``replication`` consecutive ranks see the same batches. Without a process
    group, torchrun's RANK / WORLD_SIZE (a loader built before init_distributed)."""
    if dist.is_initialized():
        rank_, world = dist.get_rank(), dist.get_world_size()
    else:
        rank_, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    replication = max(1, int(replication))
    return DataShare(rank_ // replication, max(1, world // replication), replication)


def barrier(op: str = "barrier") -> None:
    """Wait for every rank; ``op`` names what the ranks meet for, in the error when one never comes."""
    if dist.is_initialized():
        with collective(op):
            dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place (a no-op on one process)."""
    if dist.is_initialized():
        with collective("all_reduce (sum)"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    with collective("broadcast from rank 0"):
        dist.broadcast_object_list(holder, src=0)
    return holder[0]


def all_gather_object(obj, op: str = "all_gather_object") -> list:
    """Every rank's ``obj``, in rank order, on every rank; ``op`` names what for, in the error when a rank never
    comes."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size()
    with collective(op):
        dist.all_gather_object(gathered, obj)
    return gathered


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
