"""Stop anywhere, continue anywhere, the other way round: a run started with `llmfoundry ray` and stopped mid-way
(its driver and Ray cluster killed) is continued by `llmfoundry slurm` from the same save_folder and ends bitwise
equal to the uninterrupted torchrun reference (tests/launch/test_ray_train.py goes from torchrun to Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.distributed.helpers import kill_tree, losses, worker_env
from tests.launch.launch_helpers import (assert_same_training, batches, hold, job_log, submit, wait_for_state,
                                         wait_until_held, write_recipe)
from tests.launch.ray_helpers import ray_recipe

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_run_stopped_under_ray_continues_under_slurm(slurm_cluster, torchrun_reference, tmp_path, mds_root,
                                                     tokenizer_dir):
    folder = tmp_path / "run"
    # the Ray run's workers stop at the end of batch 5 (ep0-ba4 saved) until killed; the Slurm job goes past it
    recipe = write_recipe(hold(ray_recipe(mds_root, tokenizer_dir, folder), folder, batch=5, release=False), tmp_path)
    log = open(tmp_path / "ray.log", "w")
    driver = subprocess.Popen([sys.executable, "-m", "llmfoundry.cli", "ray", str(recipe), "--num-workers", "2",
                               "--address", "local", "--storage-path", str(tmp_path / "ray")],
                              cwd=tmp_path, env=worker_env(), stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_until_held(folder, 5, lambda: None if driver.poll() is None else (tmp_path / "ray.log").read_text()[-3000:],
                        timeout=400)
    finally:
        kill_tree(driver)  # the driver, its Ray cluster and the workers, at once
    assert max(losses(folder / "metrics.jsonl")) == 4 and (folder / "ckpt" / "ep0-ba4" / ".metadata").exists()

    job = submit(recipe, folder)
    info = wait_for_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=400)
    assert info["JobState"] == "COMPLETED", job_log(folder)
    # the Slurm job resumed from ep0-ba4 (batches 1-4 were trained once, by Ray); the batches after it that Ray had
    # trained are trained again (rows seen twice); the end is the reference's
    seen = batches(folder)
    assert all(len(seen[b]) == len(torchrun_reference["batches"][b]) for b in range(1, 5))
    assert_same_training(torchrun_reference, folder, exactly_once=False)
