"""A rank that never reaches a collective does not hang the job: the rank waiting in it fails within dist_timeout
with one line naming itself and the operation (real torchrun, gloo, 2 processes)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.distributed.helpers import kill_tree, torchrun_args, worker_env

WORKER = Path(__file__).with_name("_hang_worker.py")


@pytest.mark.dist
@pytest.mark.slow  # torchrun starts 2 processes: ~10 s alone, ~25 s on a busy 2-core machine
def test_a_rank_stuck_before_a_collective_fails_the_job_within_dist_timeout(tmp_path):
    op, named = "barrier", "checkpoint save"
    started = time.monotonic()
    proc = subprocess.Popen([*torchrun_args(2), str(WORKER), "3", op], cwd=tmp_path, env=worker_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    elapsed = time.monotonic() - started
    assert proc.returncode != 0, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors, out[-6000:]
    assert errors[0].startswith(f"error: rank 0 of 2: {named} did not complete within dist_timeout=3s"), errors[0]
    waited = [float(line.split()[3][:-1]) for line in out.splitlines() if line.startswith("rank 0 waited")]
    assert waited and 2.5 <= waited[0] < 20, out[-3000:]  # the 3 s limit, not the 600 s sleep
    assert "Traceback" not in out.split("error: rank 0")[0][-2000:], out[-3000:]
    assert elapsed < 90
