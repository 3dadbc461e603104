"""A new piece of checkpointed state touches one file (train.components): a callback declaring ``state_name``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfoundry.train.checkpoint import _read_small_state
from tests.distributed.helpers import run_job

pytestmark = pytest.mark.dist


def test_a_new_stateful_callback_is_saved_restored_and_carried_from_two_ranks_to_one(dist_recipe, tmp_path):
    """tests/distributed/_batch_tally.py is a piece of state that no other file knows of: a 2-rank FSDP run saves
    it at batch 4, a 1-rank run resumes it there and goes on counting; load_ignore_keys can leave it out."""
    plugin = Path(__file__).resolve().parent / "_batch_tally.py"

    def recipe(name, **overrides):
        (tmp_path / name).mkdir()
        tally = {"batch_tally": {"folder": str(tmp_path / name)}}
        return dist_recipe(**{"code_paths": [str(plugin)], "callbacks": tally, "save_folder": str(tmp_path / "ckpt"),
                              "save_interval": "4ba", **overrides})

    def tally(name):
        return [json.loads(line) for line in (tmp_path / name / "tally.jsonl").read_text().splitlines()]

    run_job(recipe("two", max_duration="4ba", fsdp_config={"sharding_strategy": "FULL_SHARD"}), tmp_path, "two")
    saved = tally("two")[-1]
    assert (saved["batch"], saved["tally"], saved["world_size"]) == (4, 4, 2)
    for rank in (0, 1):
        state = _read_small_state(tmp_path / "ckpt" / "ep0-ba4" / f"rank{rank}.pt")["trainer"]["batch_tally"]
        assert state["batches"] == 4 and float(state["loss_sum"]) == saved["loss_sum"]

    run_job(recipe("one", max_duration="6ba", autoresume=True), tmp_path, "one", nproc=1)
    assert [(t["batch"], t["tally"], t["world_size"]) for t in tally("one")] == [(5, 5, 1), (6, 6, 1)]
    assert tally("one")[0]["loss_sum"] > saved["loss_sum"]  # the sum went on from the saved one

    run_job(recipe("ignored", max_duration="6ba", load_path=str(tmp_path / "ckpt" / "ep0-ba4"), save_folder=None,
                   load_ignore_keys=["state/callbacks/batch_tally"]), tmp_path, "ignored", nproc=1)
    assert [(t["batch"], t["tally"]) for t in tally("ignored")] == [(5, 1), (6, 2)]
