"""Helpers for the Ray tests: one local Ray cluster per module, the tiny 2-rank recipe, comparing with torchrun."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from llmfoundry.core import objectstore
from tests.dist.helpers import checkpoint_weights, losses, run_job, seen_rows, torchrun_args
from tests.helpers import tiny_recipe
from tests.launch.launch_helpers import WORKER, fixed_partition

FAULTS = Path(__file__).with_name("_ray_faults.py")  # code_paths file: the exit_once callback
FINAL = "ep0-ba10"
# What the moto server needs from any process that talks to it (Ray's workers start with the environment the
# cluster was started with, so these are set before ray.init; the s3_server fixture sets the same values).
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def cluster_environment(moto_url: str) -> dict[str, str]:
    return {**FAKE_AWS, "S3_ENDPOINT_URL": moto_url, "AWS_ENDPOINT_URL_S3": moto_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parents[2]), os.environ.get("PYTHONPATH")]))}


def ray_recipe(mds_root: Path, tokenizer_dir: Path, folder: Path, **overrides) -> dict:
    """The tiny 10-batch recipe for 2 ranks: checkpoints every 4 batches, autoresume, samples and losses recorded
    in ``folder`` (record_samples comes in through code_paths, with exit_once)."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe = tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="10ba", python_log_level=None,
                         code_paths=[str(WORKER), str(FAULTS)], save_folder=str(folder / "ckpt"),
                         save_interval="4ba", autoresume=True, preemption_check_interval=1,
                         callbacks={"record_samples": {"folder": str(folder)}},
                         loggers={"jsonl": {"path": str(folder / "metrics.jsonl")}})
    fixed_partition(recipe)
    recipe.update(overrides)
    return recipe


def torchrun_reference(mds_root: Path, tokenizer_dir: Path, folder: Path) -> dict:
    """`torchrun --nproc_per_node 2` on the tiny recipe: per-step losses, samples per batch, final weights."""
    recipe = ray_recipe(mds_root, tokenizer_dir, folder)
    run_job(recipe, folder, "reference", entry=[*torchrun_args(2), "-m", "llmfoundry.cli", "train"])
    return {"losses": losses(folder / "metrics.jsonl"), "batches": batches(folder),
            "weights": checkpoint_weights(folder / "ckpt" / FINAL)}


def batches(folder: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for row in seen_rows(folder):
        found.setdefault(row["batch"], []).extend(row["rows"])
    return found


def download_checkpoint(url: str, dest: Path) -> Path:
    """A checkpoint folder in the object store, copied to ``dest``/<name> (to read its weights here)."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    root = url.rstrip("/")[: -len(name) - 1]
    return objectstore.ObjectFolder(root, "test").download(name, dest)


def assert_same_training(reference: dict, folder: Path, weights_folder: Path | None = None,
                         exactly_once: bool = True) -> None:
    """Final weights and per-step losses bitwise equal to the reference's; each batch made of the reference's
    samples, each trained once unless a crash made batches since the newest checkpoint run again."""
    got = checkpoint_weights(weights_folder or folder / "ckpt" / FINAL)
    assert set(got) == set(reference["weights"])
    for key, expected in reference["weights"].items():
        assert torch.equal(expected, got[key]), key
    seen = batches(folder)
    assert sorted(seen) == list(range(1, 11))
    for batch, rows in seen.items():
        expected = sorted(reference["batches"][batch])
        repeats = len(rows) // len(expected)
        assert sorted(rows) == sorted(expected * repeats) and (repeats == 1 or not exactly_once), f"batch {batch}"
    got_losses = losses(folder / "metrics.jsonl")
    assert sorted(got_losses) == list(range(1, 11))
    for step, loss in got_losses.items():
        assert loss == reference["losses"][step], f"step {step}"

