"""precision: amp_fp8 under FSDP2 (#30): float8 all-gather of the weight shards gives the one-rank losses and
gradients (2 gloo ranks on CPU; torchao's float8 runs there), and its DCP checkpoint loads with or without float8."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.helpers import checkpoint_weights, forked_ranks_args, losses, run_job

pytestmark = pytest.mark.dist
WORKER = Path(__file__).with_name("_float8_fsdp_worker.py")
TRAIN = [*forked_ranks_args(2), str(Path(__file__).with_name("_float8_train_worker.py"))]
FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}


def test_fsdp_float8_all_gather_gives_the_one_rank_losses_and_gradients_and_checkpoints_interchange(tmp_path):
    run_job({}, tmp_path, "float8", nproc=2, entry=[*forked_ranks_args(2), str(WORKER)], timeout=300)
    log = (tmp_path / "float8.log").read_text()
    assert log.count("float8 all-gather matches one rank") == 2, log
    assert log.count("the float8 checkpoint loads into amp_fp8 and fp32") == 2, log


def test_an_amp_fp8_fsdp_run_resumes_bitwise_from_its_checkpoint(dist_recipe, tmp_path):
    """llmfoundry train, 2 FSDP2 ranks, amp_fp8 (float8 all-gather): a run stopped after its checkpoint at batch 2
    and resumed continues with the uninterrupted run's losses and ends with its weights, bitwise."""
    def recipe(name, duration):
        return dist_recipe(max_duration=duration, save_interval="2ba", fsdp_config=FSDP, precision="amp_fp8",
                           autoresume=True, save_folder=str(tmp_path / name),
                           loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}})

    run_job(recipe("straight", "4ba"), tmp_path, "straight", entry=TRAIN)
    run_job(recipe("stopped", "2ba"), tmp_path, "stopped", entry=TRAIN)
    run_job(recipe("stopped", "4ba"), tmp_path, "resumed", entry=TRAIN)
    straight, resumed = losses(tmp_path / "straight.jsonl"), losses(tmp_path / "stopped.jsonl")
    assert sorted(resumed) == [1, 2, 3, 4] and resumed == straight
    expected, got = (checkpoint_weights(tmp_path / name / "ep0-ba4") for name in ("straight", "stopped"))
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
