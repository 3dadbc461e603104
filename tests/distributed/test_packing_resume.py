"""A packed finetuning run on 2 ranks (torchrun, gloo, CPU) resumed mid-epoch: each rank's rows carried over
between batches are in the checkpoint, so the resumed run trains exactly what the uninterrupted one trains."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.helpers import checkpoint_weights, run_job
from tests.helpers import write_prompt_response_jsonl

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # about a minute: two 2-rank jobs


def test_two_rank_packed_run_resumed_mid_epoch_ends_with_the_same_weights(dist_recipe, corpus, tmp_path):
    data = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus)
    loader = {"name": "finetuning", "drop_last": True,
              "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": {"train": str(data)}}, "split": "train",
                          "max_seq_len": 64, "shuffle": True, "shuffle_seed": 3, "packing_ratio": 2.5}}

    def recipe(name, **overrides):
        return dist_recipe(train_loader=loader, max_duration="4ba", save_interval="2ba",
                           save_folder=str(tmp_path / name), **overrides)

    run_job(recipe("straight"), tmp_path, "straight")
    saved = torch.load(tmp_path / "straight" / "ep0-ba2" / "rank0.pt", weights_only=True)["dataloader"]
    assert len(saved["leftover_bins"]) == 2 and all(any(per_rank) for per_rank in saved["leftover_bins"])
    run_job(recipe("resumed", load_path=str(tmp_path / "straight" / "ep0-ba2")), tmp_path, "resumed")
    expected = checkpoint_weights(tmp_path / "straight" / "ep0-ba4")
    got = checkpoint_weights(tmp_path / "resumed" / "ep0-ba4")
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
