"""Fixtures for the launch tests: a tiny recipe for cluster jobs, and a real one-host Slurm cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import tiny_recipe
from tests.launch.launch_helpers import WORKER, fixed_partition

SETUP_SLURM = Path(__file__).with_name("setup_slurm.sh")


@pytest.fixture
def launch_recipe(mds_root, tokenizer_dir):
    """A tiny 10-batch recipe for 2 ranks; record_samples comes in through code_paths (the job runs llmfoundry.cli)."""
    def make(folder: Path, **overrides):
        folder.mkdir(parents=True, exist_ok=True)
        r = tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="10ba", python_log_level=None,
                        code_paths=[str(WORKER)], save_folder=str(folder / "ckpt"), save_interval="4ba",
                        autoresume=True, preemption_check_interval=1,
                        callbacks={"record_samples": {"folder": str(folder)}},
                        loggers={"jsonl": {"path": str(folder / "metrics.jsonl")}})
        fixed_partition(r)
        r.update(overrides)
        return r

    return make


@pytest.fixture(scope="session")
def slurm_cluster():
    """Slurm daemons on this host, started by tests/launch/setup_slurm.sh (a no-op when they answer; it installs
    Debian's slurm-wlm and munge when missing). Skipped only where the packages cannot be installed."""
    result = subprocess.run(["bash", str(SETUP_SLURM)], check=False, capture_output=True, text=True, timeout=900)
    if result.returncode == 3:
        pytest.skip(f"Slurm cannot be installed here: {result.stderr.strip()}")
    assert result.returncode == 0, f"setup_slurm.sh failed:\n{result.stdout}\n{result.stderr}"
    return True


@pytest.fixture(scope="session")
def ray_reference(tmp_path_factory, mds_root, tokenizer_dir):
    """The torchrun run the Ray tests compare with (tests/launch/ray_helpers.py), shared by their modules."""
    from tests.launch.ray_helpers import torchrun_reference

    return torchrun_reference(mds_root, tokenizer_dir, tmp_path_factory.mktemp("ray-reference"))
