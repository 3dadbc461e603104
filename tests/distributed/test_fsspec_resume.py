"""A 2-rank FSDP run whose data and checkpoints are on a store served through core/fsspec_store.py (gs:// on
gcp-storage-emulator, azure:// on Azurite: ``fsspec_store``), SIGKILLed mid-run and resumed by autoresume: every
loss equals the uninterrupted run's on local data and a local save_folder. One kill per store."""

from __future__ import annotations

import pytest

from llmfoundry.train import uploads
import time

from tests.distributed.helpers import kill_tree, launch, losses, run_job
from tests.helpers import upload_split
from tests.launch.launch_helpers import hold, wait_until_held

pytestmark = pytest.mark.dist

FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}


def test_a_run_on_a_store_killed_mid_run_resumes_where_its_newest_complete_checkpoint_left_off(
        dist_recipe, fsspec_store, mds_root, tmp_path):
    data = f"{fsspec_store}/mds"
    upload_split(mds_root, "train", data)

    def recipe(name, **overrides):
        return dist_recipe(max_duration="8ba", save_interval="2ba", fsdp_config=FSDP, autoresume=True,
                           loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **overrides)

    run_job(recipe("straight", save_folder=str(tmp_path / "straight")), tmp_path, "straight")

    on_store = recipe("killed", save_folder=f"{fsspec_store}/runs/killed",
                      checkpoint_upload={"staging_folder": str(tmp_path / "staging")})
    on_store["train_loader"]["dataset"] = {**on_store["train_loader"]["dataset"], "remote": data,
                                           "local": str(tmp_path / "cache")}
    # parked at the end of batch 5 until ep0-ba2's background upload is complete (under load it can take longer
    # than three batches), then killed: what it resumes from is ep0-ba2 or ep0-ba4, however slow the machine
    on_store.setdefault("callbacks", {})
    job = launch(hold(on_store, tmp_path, 5, release=False), tmp_path, "killed")
    try:
        wait_until_held(tmp_path, 5, ended=job.poll)
        deadline = time.monotonic() + 120
        while "ep0-ba2" not in uploads.RemoteCheckpoints(on_store["save_folder"]).complete_checkpoints():
            assert time.monotonic() < deadline, "ep0-ba2 was not uploaded within 120 s"
            time.sleep(0.2)
    finally:
        kill_tree(job)
    last = max(losses(tmp_path / "killed.jsonl"))
    first_part = losses(tmp_path / "killed.jsonl")
    (tmp_path / "killed.jsonl").rename(tmp_path / "killed-part1.jsonl")
    run_job(on_store, tmp_path, "killed-resume")

    straight, resumed = losses(tmp_path / "straight.jsonl"), losses(tmp_path / "killed.jsonl")
    resumed_from = min(resumed) - 1
    assert resumed_from in (2, 4) and resumed_from <= last, (last, resumed_from)
    assert sorted(resumed) == list(range(resumed_from + 1, 9))
    for step, loss in {**first_part, **resumed}.items():
        assert loss == straight[step], f"step {step} (killed after {last}, resumed from {resumed_from})"
    assert uploads.RemoteCheckpoints(on_store["save_folder"]).read_text("latest").strip() == "ep0-ba8"
