"""`llmfoundry ray` on a real local Ray cluster (CPU, gloo): it trains what torchrun trains, bitwise; a rank that
dies is restarted by Ray and training resumes from the newest checkpoint; a run stopped under torchrun with its
checkpoints in S3 (moto) continues under Ray, with Ray's own storage in S3 too, and when that driver is killed, the
same command again resumes the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmfoundry.launch import ray as ray_launch
from tests.distributed.helpers import kill_tree, launch, losses, torchrun_args
from tests.helpers import S3_TEST_BUCKET
from tests.launch.launch_helpers import (FINAL, assert_same_training, hold, llmfoundry, release_hold, wait_until_held,
                                         write_recipe)
from tests.launch.ray_helpers import cluster_environment, download_checkpoint, ray_recipe

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def ray_cluster(moto_s3):
    """A Ray cluster of this module's own (never one already running on the machine), 3 logical CPUs."""
    saved = dict(os.environ)
    os.environ.update(cluster_environment(moto_s3.url))  # the workers start with this environment
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def reference(ray_cluster, torchrun_reference):
    return torchrun_reference


@pytest.mark.slow
def test_a_dead_rank_is_restarted_resumes_from_the_newest_checkpoint_and_ends_bitwise_like_torchrun(
        reference, tmp_path, mds_root, tokenizer_dir):
    """One Ray run for both: it trains what torchrun trains (bitwise, from Ray's process group), and when rank 1
    dies (os._exit after batch 6) Ray restarts the group, which resumes from ep0-ba4. (A run that continues
    exactly once, nothing repeated, is test_run_stopped_under_torchrun_continues_under_ray_from_s3.)"""
    marker = tmp_path / "rank1-exited"
    recipe = ray_recipe(mds_root, tokenizer_dir, tmp_path)
    recipe["callbacks"]["exit_once"] = {"marker": str(marker), "rank": 1, "batch": 6}
    result = ray_launch.fit(str(write_recipe(recipe, tmp_path)), num_workers=2, max_failures=1,
                            storage_path=str(tmp_path / "ray"), run_name="dies-once")
    assert marker.exists()  # rank 1 did exit after batch 6 on the first attempt
    assert result.error is None
    assert json.loads(Path(result.checkpoint.path, "llmfoundry_checkpoint.json").read_text())["batch"] == 10
    # batches 5 and 6 ran twice (after the crash, from ep0-ba4), everything else once; the end is bitwise the same
    seen = [row["batch"] for row in _rank0_rows(tmp_path)]
    assert seen[:6] == [1, 2, 3, 4, 5, 6] and seen[-6:] == [5, 6, 7, 8, 9, 10] and len(seen) in (12, 13), seen
    assert_same_training(reference, tmp_path, exactly_once=False)
    # Ray's run knows our checkpoints, of both attempts (pointers in its run folder; nothing was copied)
    runs = tmp_path / "ray" / "dies-once" / "checkpoints"
    pointers = {p.name: json.loads((p / "llmfoundry_checkpoint.json").read_text()) for p in runs.iterdir()}
    assert sorted(pointers) == ["ep0-ba10", "ep0-ba4", "ep0-ba8"]
    assert pointers[FINAL]["path"] == str(tmp_path / "ckpt" / FINAL) and pointers[FINAL]["batch"] == 10
    assert not any(p.name.endswith(".distcp") for p in runs.rglob("*"))


def _rank0_rows(folder):
    path = folder / "samples-2x-rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.s3
def test_run_stopped_under_torchrun_continues_under_ray_from_s3_and_a_killed_driver_run_again_resumes(
        reference, tmp_path, mds_root, tokenizer_dir, s3_server, monkeypatch):
    """Stop anywhere, continue anywhere, in one run: torchrun stops (flag file: checkpoint, exit 75) with its
    checkpoints in S3; `llmfoundry ray` continues from there, with Ray's storage in S3 as well; that driver dies
    (SIGKILL; Ray ends its run) and `llmfoundry ray` again with the same run name continues from the newest
    checkpoint, ending as the reference."""
    import moto
    from packaging.version import Version

    if Version(moto.__version__) < Version("5.2.2"):  # getmoto/moto#10055, fixed in 5.2.2
        pytest.fail(f"moto {moto.__version__} answers pyarrow's CompleteMultipartUpload (Ray's S3 storage) with a "
                    "malformed result: install moto[server]>=5.2.2")
    save_folder = f"s3://{S3_TEST_BUCKET}/runs/moved/ckpt"
    recipe = hold(ray_recipe(mds_root, tokenizer_dir, tmp_path, save_folder=save_folder, run_name="moved"),
                  tmp_path, batch=5)
    # the first Ray driver's workers stop at the end of batch 7 for good (the rerun finds their markers, goes on)
    recipe = hold(recipe, tmp_path, batch=7, release=False, name="second_hold")
    flag = tmp_path / "stop-now"
    monkeypatch.setenv("LLMFOUNDRY_PREEMPT_FILE", str(flag))
    proc = launch(recipe, tmp_path, "torchrun", entry=[*torchrun_args(2), "-m", "llmfoundry.cli", "train"])
    try:
        wait_until_held(tmp_path, 5, lambda: None if proc.poll() is None else f"torchrun exited {proc.returncode}")
        flag.touch()
        release_hold(tmp_path, 5)
        assert proc.wait(timeout=300) != 0  # stopped with its checkpoint, not finished
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert max(losses(tmp_path / "metrics.jsonl")) == 5  # flagged while held at batch 5: saved and stopped there
    monkeypatch.delenv("LLMFOUNDRY_PREEMPT_FILE")

    path = write_recipe(recipe, tmp_path, "ray")
    args = ["ray", str(path), "--num-workers", "2", "--storage-path", f"s3://{S3_TEST_BUCKET}/ray-runs"]
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen([sys.executable, "-m", "llmfoundry.cli", *args, "--address", address], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_held(tmp_path, 7, lambda: None if driver.poll() is None else f"the driver exited {driver.returncode}")
    finally:
        driver.kill()
        driver.wait()
    result = llmfoundry(args, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    final = download_checkpoint(f"{save_folder}/{FINAL}", tmp_path / "downloaded")
    assert_same_training(reference, tmp_path, weights_folder=final, exactly_once=False)
    seen = [row["batch"] for row in _rank0_rows(tmp_path)]
    # torchrun's 1-5 once (Ray went on from its ep0-ba5, nothing repeated); the killed driver's 6-7 trained again
    # after it, from the same ep0-ba5, the newest complete checkpoint
    assert seen == [1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10], seen
    import boto3

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=S3_TEST_BUCKET, Prefix="ray-runs/moved/")
            .get("Contents", [])]
    assert "ray-runs/moved/checkpoints/ep0-ba10/llmfoundry_checkpoint.json" in keys, keys


# ----- bad input: one line, exit code 2, before Ray is asked for anything -----
@pytest.mark.parametrize(("args", "message"), [
    (["--num-workers", "0"], "--num-workers: 0 (use 1 or more)"),
    (["--num-workers", "3"], "global_train_batch_size: 8 does not divide across 3 ranks"),
    (["--num-workers", "2", "--max-failures", "2", "save_folder=null", "autoresume=false"],
     "save_folder: not set, so the 2 restart(s) of --max-failures would start training over"),
    (["--num-workers", "2", "--storage-path", "gs://bucket/runs"], "--storage-path"),
    (["--num-workers", "2", "--cpus-per-worker", "0"], "--cpus-per-worker: 0.0 (use more than 0)"),
    (["--num-workers", "2", "max_duration=banana"], "max_duration"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, mds_root, tokenizer_dir, args, message):
    recipe = write_recipe(ray_recipe(mds_root, tokenizer_dir, tmp_path), tmp_path)
    was_running = ray.is_initialized()
    result = llmfoundry(["ray", str(recipe), *args], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert ray.is_initialized() == was_running  # nothing was started


def test_storage_path_on_s3_gets_the_endpoint_of_s3_endpoint_url(monkeypatch):
    from pyarrow.fs import FileSystem, S3FileSystem

    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    uri = ray_launch.storage("s3://bucket/some/runs/")
    filesystem, path = FileSystem.from_uri(uri)  # what each Ray process does with it
    assert isinstance(filesystem, S3FileSystem) and path == "bucket/some/runs"
    assert filesystem.region == "eu-west-1" and "127.0.0.1:9000" in str(filesystem.__reduce__())
    assert os.path.isabs(ray_launch.storage("relative/runs"))


@pytest.mark.slow
def test_bad_input_seen_only_by_the_workers_is_one_line_and_exit_code_2(ray_cluster, tmp_path, mds_root,
                                                                        tokenizer_dir):
    recipe = ray_recipe(mds_root, tokenizer_dir, tmp_path)
    recipe["callbacks"]["refuse"] = {"reason": "not on this node"}
    result = llmfoundry(["ray", str(write_recipe(recipe, tmp_path)), "--num-workers", "2"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]  # Ray's worker logs around it
    assert ours == ["error: callbacks.refuse: not on this node (Ray worker of rank 0)"], result.stderr[-3000:]
