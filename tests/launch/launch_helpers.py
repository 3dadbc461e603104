"""Helpers for the launch tests: submit with `llmfoundry slurm`, watch jobs with scontrol, find ranks' processes."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from llmfoundry import cli
from tests.distributed.helpers import (  # WORKER: registers record_samples and hold (via code_paths)
    REPO, WORKER, checkpoint_weights, losses, run_job, seen_rows, torchrun_args, worker_env)
from tests.helpers import tiny_recipe

FINAL = "ep0-ba10"  # the launch recipe's last checkpoint


def fixed_partition(recipe: dict) -> dict:
    """Streaming's sample order depends on the number of canonical nodes, which defaults to the number of physical
    nodes: fixing it makes one node with 2 ranks and 2 nodes with 1 rank each train on the same batches."""
    recipe["train_loader"]["dataset"]["num_canonical_nodes"] = 2
    return recipe


def launch_recipe(mds_root: Path, tokenizer_dir: Path, folder: Path, code_paths: tuple[Path, ...] = (),
                  **overrides) -> dict:
    """The tiny 10-batch recipe for 2 ranks that the cluster tests launch: checkpoints every 4 batches, autoresume,
    samples and losses recorded in ``folder`` (record_samples comes in through code_paths: jobs run llmfoundry.cli)."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe = tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="10ba", python_log_level=None,
                         code_paths=[str(WORKER), *map(str, code_paths)], save_folder=str(folder / "ckpt"),
                         save_interval="4ba", autoresume=True, preemption_check_interval=1,
                         callbacks={"record_samples": {"folder": str(folder)}},
                         loggers={"jsonl": {"path": str(folder / "metrics.jsonl")}})
    fixed_partition(recipe)
    recipe.update(overrides)
    return recipe


def run_torchrun_reference(mds_root: Path, tokenizer_dir: Path, folder: Path) -> dict:
    """`torchrun --nproc_per_node 2` on the launch recipe: per-step losses, samples per batch, final weights."""
    recipe = launch_recipe(mds_root, tokenizer_dir, folder)
    run_job(recipe, folder, "reference", entry=[*torchrun_args(2), "-m", "llmfoundry.cli", "train"])
    return {"losses": losses(folder / "metrics.jsonl"), "batches": batches(folder),
            "weights": checkpoint_weights(folder / "ckpt" / FINAL)}


def batches(folder: Path) -> dict[int, list[str]]:
    """Sample hashes per batch, over all ranks, as record_samples wrote them in ``folder``."""
    found: dict[int, list[str]] = {}
    for row in seen_rows(folder):
        found.setdefault(row["batch"], []).extend(row["rows"])
    return found


def assert_same_training(reference: dict, folder: Path, weights_folder: Path | None = None,
                         exactly_once: bool = True) -> None:
    """Final weights and per-step losses bitwise equal to the reference's; each batch made of the reference's
    samples, and (``exactly_once``) trained once: a stop that checkpoints first loses and repeats nothing, while
    after a crash the batches since the newest checkpoint are trained again (their rows appear twice)."""
    got = checkpoint_weights(weights_folder or folder / "ckpt" / FINAL)
    assert set(got) == set(reference["weights"])
    for key, expected in reference["weights"].items():
        assert torch.equal(expected, got[key]), key
    seen = batches(folder)
    assert sorted(seen) == list(range(1, 11))
    for batch, rows in seen.items():
        expected = sorted(reference["batches"][batch])
        repeats = len(rows) // len(expected)
        assert sorted(rows) == sorted(expected * repeats) and (repeats == 1 or not exactly_once), f"batch {batch}"
    got_losses = losses(folder / "metrics.jsonl")
    assert sorted(got_losses) == list(range(1, 11))
    for step, loss in got_losses.items():
        assert loss == reference["losses"][step], f"step {step}"


def write_recipe(recipe: dict, folder: Path, name: str = "recipe") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def llmfoundry(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`llmfoundry ARGS` run in this process (in ``cwd``), its exit code and output as a CompletedProcess."""
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def submit(recipe: Path, run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    """`llmfoundry slurm RECIPE --nodes 1 --gpus-per-node 2 --cpu --run-dir RUN_DIR ...` as a user runs it (its
    own process, with ``env`` added to the environment: sbatch passes that environment on to the job); returns the
    job id."""
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "slurm", str(recipe), "--nodes", "1",
                             "--gpus-per-node", "2", "--cpu", "--run-dir", str(run_dir), *extra], cwd=run_dir.parent,
                            env={**worker_env(), **(env or {})}, check=False, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def sbatch(script: Path, *options: str) -> str:
    result = subprocess.run(["sbatch", "--parsable", *options, str(script)], check=False, capture_output=True,
                            text=True, env=worker_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as key -> value ({} once Slurm has forgotten the job)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], check=False, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_for_state(job_id: str, states: set[str], timeout: float = 240, release: bool = True) -> dict[str, str]:
    """Poll until the job's state is one of ``states``; a requeued job held until its BeginTime is released
    (scontrol update StartTime=now) when ``release``."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = job_info(job_id)
        if info.get("JobState") in states:
            return info
        if release and info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime" \
                and not job_processes(job_id):  # released before its old step is gone, Slurm kills the new run
            time.sleep(1)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never reached {states}: {info}")


def job_ended(job_id: str) -> str | None:
    """The Slurm job's state once it is no longer pending or running; None while it is."""
    state = job_info(job_id).get("JobState")
    return None if state in ("PENDING", "RUNNING", "CONFIGURING", None) else f"job {job_id} ended ({state})"


def hold(recipe: dict, folder: Path, batch: int, release: bool = True, name: str = "hold", **settings) -> dict:
    """``recipe`` with tests/distributed/_train_worker.py's `hold` callback (or its twin `second_hold`), which parks every
    rank at the end of ``batch`` on the first attempt, until ``release_hold(folder, batch)`` (when ``release``), a
    signal or a kill: the test's fault then lands at that batch, before it is logged, saved or checked for
    preemption, however fast the machine trains."""
    recipe["callbacks"][name] = {"batch": batch, "folder": str(folder), "release": release, **settings}
    return recipe


def wait_for_files(files: list[Path], what: str, ended=lambda: None, timeout: float = 300) -> None:
    """Until every file exists; ``ended()`` says why the run stopped early (None while it runs)."""
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        why = ended()
        assert why is None, f"the run ended before {what}: {why}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def wait_until_held(folder: Path, batch: int, ended=lambda: None, ranks: int = 2, timeout: float = 300) -> None:
    """Until every rank is parked by a hold at ``batch``."""
    wait_for_files([folder / f"held-b{batch}-rank{r}" for r in range(ranks)], f"its hold at batch {batch}", ended,
                   timeout)


def release_hold(folder: Path, batch: int) -> None:
    (folder / f"release-b{batch}").touch()


@contextlib.contextmanager
def cancelled_on_failure(job_id: str):
    """scancel the job when the block fails: a job parked by a hold would otherwise wait out its 600 s."""
    try:
        yield
    except BaseException:
        subprocess.run(["scancel", job_id], check=False)
        raise


def job_log(run_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((run_dir / "slurm").glob("*.out")))


# Several "nodes" or "pods" on one host: each gets a /dev/shm of its own, as real machines have (the streaming data
# loader's shared memory is named per host, so two node leaders on one host would collide).
OWN_SHM = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /dev/shm && exec "$@"', "sh"]


def process_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def rank_processes(rank: int, **environ: str) -> list[int]:
    """Training processes of ``rank`` (torchrun's workers, not their data loader workers, which inherit the
    environment) whose environment also has ``environ``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        env = process_environ(int(proc.name))
        if (env.get("RANK") == str(rank) and all(env.get(k) == v for k, v in environ.items())
                and process_environ(parent_pid(int(proc.name))).get("RANK") != str(rank)):
            found.append(int(proc.name))
    return found


def job_processes(job_id: str) -> list[int]:
    """Processes still running for Slurm job ``job_id`` (its batch shell, srun, torchrun, workers)."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and process_environ(int(p.name)).get("SLURM_JOB_ID") == job_id]
