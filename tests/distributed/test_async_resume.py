"""save_async on 2 ranks (torchrun, gloo, FSDP): a job killed while checkpoints are written in the background
resumes from the newest complete one and ends bitwise where a run with synchronous saves ends."""

from __future__ import annotations

import random

import pytest
import torch

from llmfoundry.train.checkpoint import list_checkpoints
from tests.distributed.helpers import checkpoint_weights, kill_at_step, launch, losses, run_job

pytestmark = pytest.mark.dist

FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}


def test_async_saves_killed_at_a_random_step_resume_bitwise_like_synchronous_saves(dist_recipe, tmp_path):
    def recipe(name, **overrides):
        return dist_recipe(max_duration="8ba", save_interval="2ba", fsdp_config=FSDP, autoresume=True,
                           save_folder=str(tmp_path / name),
                           loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **overrides)

    run_job(recipe("sync"), tmp_path, "sync")
    killed = recipe("async", save_async=True)
    # killed in flight after step 3, 4 or 5 is logged (a background write of ep0-ba2 or ep0-ba4 may be under way);
    # the steps after it are the margin a fast machine needs between seeing the step logged and the kill landing
    kill_step = random.SystemRandom().randint(3, 5)
    last = kill_at_step(launch(killed, tmp_path, "async"), tmp_path / "async.jsonl", kill_step)
    assert last < 8, f"the job finished before it could be killed at step {kill_step}"
    first_part = losses(tmp_path / "async.jsonl")
    (tmp_path / "async.jsonl").rename(tmp_path / "async-part1.jsonl")
    # Only complete checkpoints are listed; a write the kill cut short left at most a .partial folder.
    assert all(p.name in {"ep0-ba2", "ep0-ba4", "ep0-ba6"} for p in list_checkpoints(tmp_path / "async"))
    run_job(killed, tmp_path, "async-resume")

    sync, resumed = losses(tmp_path / "sync.jsonl"), losses(tmp_path / "async.jsonl")
    resumed_from = min(resumed) - 1
    assert resumed_from in (0, 2, 4, 6) and resumed_from <= last, (kill_step, resumed_from)
    for step, loss in {**first_part, **resumed}.items():
        assert loss == sync[step], f"step {step} (killed at {kill_step}, resumed from {resumed_from})"
    for name in ("ep0-ba8",) + (("ep0-ba2",) if (tmp_path / "async" / "ep0-ba2").exists() else ()):
        expected, got = checkpoint_weights(tmp_path / "sync" / name), checkpoint_weights(tmp_path / "async" / name)
        assert all(torch.equal(expected[k], got[k]) for k in expected), f"{name} (killed at {kill_step})"
