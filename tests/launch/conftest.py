"""Fixtures for the launch tests: a tiny recipe for cluster jobs, and a real one-host Slurm cluster."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from tests.launch import launch_helpers

SETUP_SLURM = Path(__file__).with_name("setup_slurm.sh")


@pytest.fixture
def launch_recipe(mds_root, tokenizer_dir):
    """launch_helpers.launch_recipe on this session's tiny data: ``launch_recipe(folder, **overrides)``."""
    return functools.partial(launch_helpers.launch_recipe, mds_root, tokenizer_dir)


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
def torchrun_reference(tmp_path_factory, mds_root, tokenizer_dir):
    """The uninterrupted torchrun run that the Slurm and Ray tests end like, run once for all their modules."""
    return launch_helpers.run_torchrun_reference(mds_root, tokenizer_dir, tmp_path_factory.mktemp("reference"))
