"""precision: amp_fp8 under FSDP2 (#30): float8 all-gather of the weight shards gives the one-rank losses and
gradients (2 gloo ranks on CPU; torchao's float8 runs there), and its DCP checkpoint loads with or without float8."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.helpers import forked_ranks_args, run_job

pytestmark = pytest.mark.dist
WORKER = Path(__file__).with_name("_float8_fsdp_worker.py")


def test_fsdp_float8_all_gather_gives_the_one_rank_losses_and_gradients_and_checkpoints_interchange(tmp_path):
    run_job({}, tmp_path, "float8", nproc=2, entry=[*forked_ranks_args(2), str(WORKER)], timeout=300)
    log = (tmp_path / "float8.log").read_text()
    assert log.count("float8 all-gather matches one rank") == 2, log
    assert log.count("the float8 checkpoint loads into amp_fp8 and fp32") == 2, log
