"""Under torchrun the examples are split across ranks and the gathered metrics equal a single process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dist
def test_two_ranks_return_the_single_process_metrics(tmp_path, tokenizer_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "eval" / "dist_worker.py"), str(tokenizer_dir), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "metrics-0.json").read_text())
    rank1 = json.loads((tmp_path / "metrics-1.json").read_text())
    single = json.loads((tmp_path / "metrics-single.json").read_text())
    assert rank0 == rank1
    assert rank0.keys() == single.keys()
    for key in single:
        assert rank0[key] == pytest.approx(single[key], abs=1e-9), key
