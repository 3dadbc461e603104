"""2-rank CPU runs (gloo) under torchrun: FSDP2 and DDP train the same model to the same losses."""

from __future__ import annotations

import sys

import pytest

from llmfoundry.train import uploads
from tests.distributed.helpers import REPO, checkpoint_weights, losses, run_job, torchrun_args

pytestmark = pytest.mark.dist


def test_fsdp_and_ddp_on_two_ranks_follow_the_same_loss_curve(dist_recipe, tmp_path):
    common = dict(max_duration="4ba", save_interval="4ba")
    ddp = dist_recipe(**common, save_folder=str(tmp_path / "ddp"), loggers={"jsonl": {"path": str(tmp_path / "ddp.jsonl")}})
    # torchrun ... scripts/train.py, the documented launch
    run_job(ddp, tmp_path, "ddp", entry=[*torchrun_args(2), str(REPO / "scripts" / "train.py")])
    fsdp = dist_recipe(**common, save_folder=str(tmp_path / "fsdp"),
                       loggers={"jsonl": {"path": str(tmp_path / "fsdp.jsonl")}},
                       fsdp_config={"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL",
                                    "activation_checkpointing": True, "limit_all_gathers": True,
                                    "state_dict_type": "full"})
    # the `llmfoundry train -n 2` shortcut over torch.distributed.run
    run_job(fsdp, tmp_path, "fsdp", entry=[sys.executable, "-m", "llmfoundry.cli", "train", "-n", "2"])
    a, b = losses(tmp_path / "ddp.jsonl"), losses(tmp_path / "fsdp.jsonl")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4), step
    assert a[4] < a[1]
    wa, wb = checkpoint_weights(tmp_path / "ddp" / "ep0-ba4"), checkpoint_weights(tmp_path / "fsdp" / "ep0-ba4")
    assert wa.keys() == wb.keys()
    for key in wa:  # Adam turns float-rounding differences of near-zero gradients into lr-sized steps
        assert (wa[key] - wb[key]).abs().max() < 1e-3, key
    assert (tmp_path / "fsdp" / "ep0-ba4" / "model_full.pt").is_file()


@pytest.mark.s3
def test_two_ranks_upload_their_shards_to_s3_before_the_checkpoint_is_complete(dist_recipe, s3_server, tmp_path):
    url = "s3://llmfoundry-test/dist"
    base = dist_recipe()
    # Also: a meta-device model materialised shard by shard, on a 2-D (replicate, shard) mesh.
    run_job(dist_recipe(max_duration="4ba", save_interval="2ba", save_folder=url,
                        model=dict(base["model"], init_device="meta"),
                        loggers={"jsonl": {"path": str(tmp_path / "s3.jsonl")}},
                        fsdp_config={"sharding_strategy": "HYBRID_SHARD", "data_parallel_shard_degree": 2,
                                     "reshard_after_forward": False},
                        checkpoint_upload={"staging_folder": str(tmp_path / "staging")}), tmp_path, "s3")
    curve = losses(tmp_path / "s3.jsonl")
    assert sorted(curve) == [1, 2, 3, 4] and 0 < curve[4] < curve[1] < 10
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba2", "ep0-ba4"]
    assert folder.read_text("latest").strip() == "ep0-ba4"
    names = {k.rsplit("/", 1)[1] for k in folder.list_keys("ep0-ba4")}
    assert {"__0_0.distcp", "__1_0.distcp", "rank0.pt", "rank1.pt", ".metadata", ".complete"} <= names
    assert set(k.rsplit("/", 1)[1] for k in folder.list_keys("ep0-ba4", ".uploaded")) == {"rank0", "rank1"}
