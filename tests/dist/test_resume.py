"""Surviving SIGKILL and a change of world size: autoresume continues exactly where the last checkpoint left off."""

from __future__ import annotations

import random
import sys

import pytest
import torch

from conftest import WORKER, checkpoint_weights, kill_at_step, launch, losses, run_job, seen_rows

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


def test_two_rank_checkpoint_resumes_on_one_rank_without_repeating_samples(dist_recipe, tmp_path):
    folder = tmp_path / "run"
    record = {"record_samples": {"folder": str(tmp_path)}}
    common = dict(save_folder=str(folder), save_interval="3ba", autoresume=True, callbacks=record)
    run_job(dist_recipe(max_duration="3ba", fsdp_config=FSDP, **common), tmp_path, "two-ranks")
    # One process, no torchrun; the FSDP settings are simply not needed on one rank.
    run_job(dist_recipe(max_duration="10ba", **common), tmp_path, "one-rank",
            entry=[sys.executable, str(WORKER)])

    rows = seen_rows(tmp_path)
    two = [r for r in rows if r["rank"] in (0, 1) and r["batch"] <= 3 and len(r["rows"]) == 4]
    one = [r for r in rows if len(r["rows"]) == 8]
    assert sorted({r["batch"] for r in two}) == [1, 2, 3] and len(two) == 6
    assert sorted(r["batch"] for r in one) == list(range(4, 11))  # continued at batch 4 = sample 24
    before = [h for r in two for h in r["rows"]]
    after = [h for r in one for h in r["rows"]]
    assert len(set(before)) == len(before) == 24
    assert len(set(after)) == len(after) == 56
    assert not set(before) & set(after), "a sample was seen twice"
