"""Helpers for multi-process tests: jobs of several ranks on CPU (gloo), forked from the rank server or launched
with torchrun, and reading what the jobs left behind.

Test modules import these as ``from tests.distributed.helpers import ...``; the ``dist_recipe`` fixture is in conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from tests.helpers import tiny_recipe

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_train_worker.py")
RANK_SERVER = Path(__file__).with_name("_rank_server.py")
RANK_CLIENT = Path(__file__).with_name("_rank_client.py")
_rank_server: tuple[subprocess.Popen, str] | None = None


def torchrun_args(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def worker_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("LOCAL_RANK", None)
    return env


def forked_ranks_args(nproc: int) -> list[str]:
    """The command that runs ``nproc`` ranks of a script forked from this session's rank server
    (tests/distributed/_rank_server.py: the training stack imported once, not once per rank and job), started on
    first use and ended with the session."""
    global _rank_server
    if _rank_server is None or _rank_server[0].poll() is not None:
        import atexit
        import tempfile

        socket_path = os.path.join(tempfile.mkdtemp(prefix="llmfoundry-ranks-"), "socket")
        # stdin: a pipe only this process holds; the server ends when it closes, however this session ends
        server = subprocess.Popen([sys.executable, str(RANK_SERVER), socket_path], env=worker_env(),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert server.stdout.readline().strip() == "ready", "the tests' rank server did not start"
        atexit.register(_end_rank_server, server, os.path.dirname(socket_path))
        _rank_server = (server, socket_path)
    return [sys.executable, str(RANK_CLIENT), _rank_server[1], str(nproc)]


def _end_rank_server(server: subprocess.Popen, folder: str) -> None:
    import shutil

    server.kill()
    server.wait()
    shutil.rmtree(folder, ignore_errors=True)


def launch(recipe_dict: dict, tmp_path: Path, name: str, nproc: int = 2, overrides=(), entry=None) -> subprocess.Popen:
    """Start a training job (entry: the command before the recipe; default: the test worker's ranks forked from
    the rank server, as torchrun would start them)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe_dict, sort_keys=False))
    entry = entry or [*forked_ranks_args(nproc), str(WORKER)]
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen([*entry, str(path), *overrides], cwd=tmp_path, env=worker_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def run_job(recipe_dict: dict, tmp_path: Path, name: str, nproc: int = 2, overrides=(), entry=None,
            timeout: float = 300) -> None:
    proc = launch(recipe_dict, tmp_path, name, nproc, overrides, entry)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    assert rc == 0, (tmp_path / f"{name}.log").read_text()[-4000:]


def kill_at_step(proc: subprocess.Popen, metrics: Path, step: int, timeout: float = 300) -> int:
    """SIGKILL the job's whole process group once rank 0 has logged ``step``; returns the last logged step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = max(losses(metrics), default=0)
        if last >= step or proc.poll() is not None:
            break
        time.sleep(0.02)
    kill_tree(proc)
    return max(losses(metrics), default=0)


def descendants(pid: int) -> list[int]:
    """Process ids of ``pid``'s children, grandchildren, ... (torchrun starts its workers in new sessions)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launched job: torchrun and every worker it started, all at the same moment."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def losses(path: Path) -> dict[int, float]:
    """step -> training loss from a jsonl metrics file."""
    if not path.exists():
        return {}
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by SIGKILL
            pass
    return {r["step"]: r["loss/train/total"] for r in rows if "step" in r}


def checkpoint_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The model weights of a DCP checkpoint folder, read in this (single) process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = folder.parent / f"{folder.name}.pt"
    dcp_to_torch_save(str(folder), str(out))
    state = torch.load(out, weights_only=False)
    out.unlink()
    return state["model"]


def seen_rows(folder: Path) -> list[dict]:
    """Rows recorded by the worker's record_samples callback: {"rank", "batch", "rows": [hash, ...]}."""
    rows = []
    for path in sorted(folder.glob("samples-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


class SharedRuns:
    """Training jobs run at most once per test module (several tests compare the same runs): ``run(name, recipe,
    nproc)`` starts the job the first time and returns its jsonl metrics file every time. Recipes name their
    files inside ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.done: set[str] = set()

    def __call__(self, name: str, recipe: dict, nproc: int, timeout: float = 600) -> Path:
        if name not in self.done:
            run_job(recipe, self.folder, name, nproc=nproc, timeout=timeout)
            self.done.add(name)
        return self.folder / f"{name}.jsonl"

    def recipe(self, mds_root: Path, tokenizer_dir: Path, name: str, steps: int, **extra) -> dict:
        """The tiny recipe of run ``name``: ``steps`` batches of 4 in microbatches of 2, a checkpoint at batch 3,
        per-step metrics in <name>.jsonl, optimizer_monitor's norms every step, and the shapes each rank holds
        (record_shapes, from tests/distributed/_train_worker.py) in <name>/."""
        (self.folder / name).mkdir(exist_ok=True)
        return tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, python_log_level=None,
                           max_duration=f"{steps}ba", global_train_batch_size=4, device_train_microbatch_size=2,
                           save_folder=str(self.folder / f"{name}-ckpt"), save_interval="3ba",
                           loggers={"jsonl": {"path": str(self.folder / f"{name}.jsonl")}},
                           callbacks={"record_shapes": {"folder": str(self.folder / name)},
                                      "optimizer_monitor": {"batch_log_interval": 1, "log_optimizer_metrics": False}},
                           **extra)


def memory_status(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmRSS: resident now; VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)
