"""Gradient accumulation under FSDP2 keeps gradients sharded between microbatches (as llm-foundry's FSDP does): the
reduce-scatter runs after each microbatch, so no rank holds the whole model's gradients (120 GiB for 70B) while a
step's microbatches accumulate."""

from __future__ import annotations

from pathlib import Path

from tests.distributed.helpers import forked_ranks_args, run_job

WORKER = Path(__file__).with_name("_grad_sync_worker.py")


def test_fsdp_gradients_are_shards_between_microbatches_and_sum_to_the_whole_batch(tmp_path):
    run_job({}, tmp_path, "accumulate", nproc=2, entry=[*forked_ranks_args(2), str(WORKER)], timeout=120)
    log = (tmp_path / "accumulate.log").read_text()
    assert log.count("shards after the first microbatch, sums right after the last") == 2, log
