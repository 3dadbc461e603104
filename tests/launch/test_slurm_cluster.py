"""Acceptance on a real one-host Slurm cluster (tests/launch/setup_slurm.sh): `llmfoundry slurm` jobs train what
torchrun trains, survive a preemption signal (requeue), a cancel (re-submission) and a killed rank (HyperPod's
re-run of the same srun line), each ending with weights bitwise equal to the uninterrupted reference."""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from llmfoundry.train.checkpoint import latest_checkpoint
from tests.distributed.helpers import losses
from tests.launch.launch_helpers import (
    FINAL,
    OWN_SHM,
    assert_same_training,
    cancelled_on_failure,
    hold,
    job_ended,
    job_info,
    job_log,
    rank_processes,
    release_hold,
    sbatch,
    submit,
    wait_for_files,
    wait_for_state,
    wait_until_held,
    write_recipe,
)
from tests.planted_secrets import leaks, plant

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_one_node_job_trains_what_torchrun_trains_and_reads_its_secrets_from_the_environment(
        slurm_cluster, torchrun_reference, launch_recipe, tmp_path):
    """Tokens planted every way a user gives one (tests/planted_secrets.py) are in no file of the run folder (the
    submitted recipe, the script, the job's log, checkpoints, metrics), and the job still gets them: it prints the
    hash of HF_TOKEN, which the command-line override set."""
    planted = plant()
    recipe_dict = planted.recipe(launch_recipe(tmp_path / "run"))
    recipe_dict["callbacks"]["print_env_hash"] = {"name": "HF_TOKEN"}
    recipe = write_recipe(recipe_dict, tmp_path)
    job = submit(recipe, tmp_path / "run", *planted.overrides, env=planted.env)
    info = wait_for_state(job, {"COMPLETED", "FAILED", "CANCELLED"})
    assert info["JobState"] == "COMPLETED", job_log(tmp_path / "run")
    assert {p.name for p in (tmp_path / "run" / "slurm").iterdir()} >= {"job.sbatch", "recipe.yaml"}
    assert_same_training(torchrun_reference, tmp_path / "run")
    assert f"HF_TOKEN sha256 {hashlib.sha256(planted.tokens['override'].encode()).hexdigest()}" in job_log(
        tmp_path / "run")
    assert not leaks(planted.tokens.values(), tmp_path / "run")


def test_b_two_nodes_on_one_host_train_what_torchrun_trains(slurm_cluster, torchrun_reference, launch_recipe, tmp_path):
    """Two srun tasks ("nodes"), each torchrun --nnodes 2 --nproc-per-node 1, rendezvous on the first host."""
    recipe = write_recipe(launch_recipe(tmp_path / "run"), tmp_path)
    submit(recipe, tmp_path / "run", "--dry-run")
    script = tmp_path / "run" / "slurm" / "job.sbatch"
    own_shm = " ".join(shlex.quote(part) for part in OWN_SHM) + " "
    text = script.read_text().replace("--nproc-per-node=2", "--nproc-per-node=1")
    script.write_text(text.replace(f"    {sys.executable} -m torch.distributed.run",
                                   f"    {own_shm}{sys.executable} -m torch.distributed.run"))
    job = sbatch(script, "--nodes=1", "--ntasks=2", "--ntasks-per-node=2")
    info = wait_for_state(job, {"COMPLETED", "FAILED", "CANCELLED"})
    log = job_log(tmp_path / "run")
    assert info["JobState"] == "COMPLETED", log
    assert "2 torchrun task(s)" in log
    assert_same_training(torchrun_reference, tmp_path / "run")


def test_c_preemption_signal_checkpoints_requeues_and_resumes_bitwise(slurm_cluster, torchrun_reference, launch_recipe,
                                                                      tmp_path):
    run = tmp_path / "run"
    recipe = write_recipe(hold(launch_recipe(run, preemption_check_interval=2), run, batch=3), tmp_path)
    job = submit(recipe, run)
    with cancelled_on_failure(job):
        wait_until_held(run, 3, lambda: job_ended(job))
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
        # the batch script's trap turns the signal into the flag file the ranks look for: released once it is there
        wait_for_files([run / "slurm" / f"preempt-{job}"], "the flag file", lambda: job_ended(job), timeout=60)
        release_hold(run, 3)
        info = wait_for_state(job, {"PENDING", "COMPLETED", "FAILED", "CANCELLED"}, release=False)
    log = job_log(run)
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", (info, log)
    assert "requeueing job" in log
    stopped = latest_checkpoint(run / "ckpt").name  # saved at the next agreed step after the signal (checks: 2, 4..)
    assert stopped == "ep0-ba4", stopped
    assert max(losses(run / "metrics.jsonl")) == 4  # nothing trained after the preemption checkpoint
    info = wait_for_state(job, {"COMPLETED", "FAILED", "CANCELLED"})
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", job_log(run)
    assert_same_training(torchrun_reference, run)


def test_d_cancel_is_not_requeued_and_a_resubmission_resumes_from_a_complete_checkpoint(
        slurm_cluster, torchrun_reference, launch_recipe, tmp_path):
    run = tmp_path / "run"
    # parked at the end of batch 5 until the cancel's SIGTERM reaches the ranks (it ends the hold)
    recipe = write_recipe(hold(launch_recipe(run, save_interval="2ba"), run, batch=5, release=False), tmp_path)
    job = submit(recipe, run)
    with cancelled_on_failure(job):
        wait_until_held(run, 5, lambda: job_ended(job))
        subprocess.run(["scancel", job], check=True)
        info = wait_for_state(job, {"CANCELLED", "COMPLETED", "FAILED"}, release=False)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    time.sleep(3)
    assert job_info(job).get("JobState") == "CANCELLED"  # not requeued
    assert (run / "slurm" / f"exit-{job}").read_text().strip() == "143"  # SIGTERM: checkpoint, then 143
    newest = latest_checkpoint(run / "ckpt")
    assert newest is not None and newest.name == "ep0-ba5"  # the cancel's own checkpoint, off save_interval
    # A checkpoint that was being written when the job died: newer, but never marked complete.
    partial = run / "ckpt" / ".tmp-ep0-ba9"
    partial.mkdir()
    (partial / "rank0.pt").write_bytes(b"cut short")
    job2 = submit(recipe, run)
    info = wait_for_state(job2, {"COMPLETED", "FAILED", "CANCELLED"})
    assert info["JobState"] == "COMPLETED", job_log(run)
    resumed_steps = sorted(s for s in losses(run / "metrics.jsonl"))
    assert_same_training(torchrun_reference, run)
    assert resumed_steps[-1] == 10


def test_e_hyperpod_style_a_killed_rank_and_the_same_srun_line_rerun_resume(slurm_cluster, torchrun_reference,
                                                                           launch_recipe, tmp_path):
    run = tmp_path / "run"
    # the first job's ranks stop at the end of batch 5 until rank 1 is killed there; the rerun goes past it
    recipe = write_recipe(hold(launch_recipe(run, save_interval="2ba"), run, batch=5, release=False), tmp_path)
    submit(recipe, run, "--dry-run", "--hyperpod", "on")
    script = run / "slurm" / "job.sbatch"
    text = script.read_text()
    assert "--auto-resume=1" in text and "--no-requeue" in text and "MAX_REQUEUES=0" in text
    # Debian's Slurm has no HyperPod auto-resume plugin: run the same script without the flag, and re-run it.
    script.write_text(text.replace(" --auto-resume=1", ""))
    job = sbatch(script)
    with cancelled_on_failure(job):
        wait_until_held(run, 5, lambda: job_ended(job))
        rank1 = rank_processes(1, SLURM_JOB_ID=job)
        assert rank1, "rank 1 not found"
        os.kill(rank1[0], signal.SIGKILL)
        info = wait_for_state(job, {"FAILED", "COMPLETED", "CANCELLED"}, release=False)
    assert info["JobState"] == "FAILED", job_log(run)
    assert latest_checkpoint(run / "ckpt").name != FINAL
    job2 = sbatch(script)
    info = wait_for_state(job2, {"COMPLETED", "FAILED", "CANCELLED"})
    assert info["JobState"] == "COMPLETED", job_log(run)
    assert_same_training(torchrun_reference, run, exactly_once=False)
