"""Surviving SIGKILL and a change of world size: autoresume continues exactly where the last checkpoint left off."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from llmfoundry.train.checkpoint import latest_checkpoint
from tests.distributed.helpers import WORKER, checkpoint_weights, kill_at_step, launch, losses, run_job, seen_rows

pytestmark = pytest.mark.dist

FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}


@pytest.mark.slow
def test_fsdp_run_killed_at_a_random_step_resumes_bitwise_identically(dist_recipe, tmp_path):
    def recipe(name):
        return dist_recipe(max_duration="10ba", save_interval="2ba", fsdp_config=FSDP, autoresume=True,
                           save_folder=str(tmp_path / name), loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}})

    run_job(recipe("straight"), tmp_path, "straight")

    kill_step = random.SystemRandom().randint(3, 8)
    killed = recipe("killed")
    proc = launch(killed, tmp_path, "killed")
    last = kill_at_step(proc, tmp_path / "killed.jsonl", kill_step)
    assert last < 10, f"the job finished before it could be killed at step {kill_step}"
    first_part = losses(tmp_path / "killed.jsonl")
    (tmp_path / "killed.jsonl").rename(tmp_path / "killed-part1.jsonl")
    run_job(killed, tmp_path, "killed-resume")

    straight, resumed = losses(tmp_path / "straight.jsonl"), losses(tmp_path / "killed.jsonl")
    resumed_from = min(resumed) - 1
    assert resumed_from % 2 == 0 and resumed_from <= last, (kill_step, resumed_from)
    assert sorted(resumed) == list(range(resumed_from + 1, 11))
    for step, loss in {**first_part, **resumed}.items():
        assert loss == straight[step], f"step {step} (killed at {kill_step}, resumed from {resumed_from})"
    expected = checkpoint_weights(tmp_path / "straight" / "ep0-ba10")
    got = checkpoint_weights(tmp_path / "killed" / "ep0-ba10")
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"{key} (killed at {kill_step})"


def _batches(folder: Path) -> dict[int, list[str]]:
    """Sample hashes of each global batch (all ranks' rows together), as the record_samples callback saw them."""
    batches: dict[int, list[str]] = {}
    for row in seen_rows(folder):
        batches.setdefault(row["batch"], []).extend(row["rows"])
    return batches


def test_two_rank_run_killed_and_resumed_on_one_rank_continues_with_the_right_samples(dist_recipe, tmp_path):
    """A 2-rank FSDP job is killed (SIGKILL) at a random step and resumed by one process: it restarts after the
    newest checkpoint and trains on exactly the samples an uninterrupted 2-rank run trains on, batch by batch."""
    def recipe(name, **overrides):
        (tmp_path / name).mkdir(exist_ok=True)
        return dist_recipe(max_duration="10ba", callbacks={"record_samples": {"folder": str(tmp_path / name)}},
                           loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **overrides)

    run_job(recipe("straight", fsdp_config=FSDP), tmp_path, "straight")
    kill_step = random.SystemRandom().randint(4, 8)
    common = dict(save_folder=str(tmp_path / "ckpt"), save_interval="3ba", autoresume=True)
    proc = launch(recipe("killed", fsdp_config=FSDP, **common), tmp_path, "killed")
    last = kill_at_step(proc, tmp_path / "killed.jsonl", kill_step)
    assert 3 <= last < 10, f"killed at step {last}, wanted {kill_step}"
    # The step is logged before its checkpoint is written, so a kill right at a save step may leave the older one.
    newest = latest_checkpoint(tmp_path / "ckpt")
    assert newest is not None and newest.name in {f"ep0-ba{3 * (last // 3)}", f"ep0-ba{3 * ((last - 1) // 3)}"}
    # One process, no torchrun; the FSDP settings are simply not needed on one rank.
    run_job(recipe("resumed", **common), tmp_path, "resumed", entry=[sys.executable, str(WORKER)])

    straight, killed, resumed = (_batches(tmp_path / n) for n in ("straight", "killed", "resumed"))
    checkpointed = min(resumed) - 1
    assert newest.name == f"ep0-ba{checkpointed}", (last, checkpointed)  # resumed from the newest complete one
    assert sorted(resumed) == list(range(checkpointed + 1, 11))
    for batch in range(1, 11):
        assert len(straight[batch]) == 8
        source = killed if batch <= checkpointed else resumed
        assert sorted(source[batch]) == sorted(straight[batch]), f"batch {batch} (resumed after {checkpointed})"
    kept = [h for b in range(1, checkpointed + 1) for h in killed[b]] + [h for b in resumed for h in resumed[b]]
    assert len(kept) == len(set(kept)) == 80, "a sample was trained on twice (or skipped)"
