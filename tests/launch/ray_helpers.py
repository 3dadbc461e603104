"""Helpers for the Ray tests: the environment of a local Ray cluster, the launch recipe with the Ray tests' fault
callbacks, checkpoints read back from the object store."""

from __future__ import annotations

import os
from pathlib import Path

from llmfoundry.core import objectstore
from tests.launch.launch_helpers import WORKER, launch_recipe

FAULTS = Path(__file__).with_name("_ray_faults.py")  # code_paths file: the exit_once callback
# What the moto server needs from any process that talks to it (Ray's workers start with the environment the
# cluster was started with, so these are set before ray.init; the s3_server fixture sets the same values).
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def cluster_environment(moto_url: str) -> dict[str, str]:
    return {**FAKE_AWS, "S3_ENDPOINT_URL": moto_url, "AWS_ENDPOINT_URL_S3": moto_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parents[2]), os.environ.get("PYTHONPATH")]))}


def ray_recipe(mds_root: Path, tokenizer_dir: Path, folder: Path, **overrides) -> dict:
    """The launch recipe with _ray_faults.py in code_paths (the exit_once callback)."""
    return launch_recipe(mds_root, tokenizer_dir, folder, code_paths=(FAULTS,), **overrides)


def download_checkpoint(url: str, dest: Path) -> Path:
    """A checkpoint folder in the object store, copied to ``dest``/<name> (to read its weights here)."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    root = url.rstrip("/")[: -len(name) - 1]
    return objectstore.ObjectFolder(root, "test").download(name, dest)
