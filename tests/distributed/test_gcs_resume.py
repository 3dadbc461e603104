"""A 2-rank FSDP run whose data and checkpoints are on gs:// (gcp-storage-emulator), SIGKILLed mid-run and
resumed by autoresume: every loss equals the uninterrupted run's on local data and a local save_folder."""

from __future__ import annotations

import pytest

from llmfoundry.train import uploads
from tests.distributed.helpers import kill_at_step, launch, losses, run_job
from tests.helpers import GCS_TEST_BUCKET, upload_split

pytestmark = pytest.mark.dist

FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}


def test_a_run_on_gs_killed_mid_run_resumes_where_its_newest_complete_checkpoint_left_off(
        dist_recipe, gcs_server, mds_root, tmp_path):
    data = f"gs://{GCS_TEST_BUCKET}/mds"
    upload_split(mds_root, "train", data)

    def recipe(name, **overrides):
        return dist_recipe(max_duration="8ba", save_interval="2ba", fsdp_config=FSDP, autoresume=True,
                           loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **overrides)

    run_job(recipe("straight", save_folder=str(tmp_path / "straight")), tmp_path, "straight")

    on_gs = recipe("killed", save_folder=f"gs://{GCS_TEST_BUCKET}/runs/killed",
                   checkpoint_upload={"staging_folder": str(tmp_path / "staging")})
    on_gs["train_loader"]["dataset"] = {**on_gs["train_loader"]["dataset"], "remote": data,
                                        "local": str(tmp_path / "cache")}
    last = kill_at_step(launch(on_gs, tmp_path, "killed"), tmp_path / "killed.jsonl", 5)
    assert last < 8, "the job finished before it could be killed"
    first_part = losses(tmp_path / "killed.jsonl")
    (tmp_path / "killed.jsonl").rename(tmp_path / "killed-part1.jsonl")
    run_job(on_gs, tmp_path, "killed-resume")

    straight, resumed = losses(tmp_path / "straight.jsonl"), losses(tmp_path / "killed.jsonl")
    resumed_from = min(resumed) - 1
    assert resumed_from in (2, 4) and resumed_from <= last, (last, resumed_from)
    assert sorted(resumed) == list(range(resumed_from + 1, 9))
    for step, loss in {**first_part, **resumed}.items():
        assert loss == straight[step], f"step {step} (killed after {last}, resumed from {resumed_from})"
    assert uploads.RemoteCheckpoints(on_gs["save_folder"]).read_text("latest").strip() == "ep0-ba8"
