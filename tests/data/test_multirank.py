"""Resuming on a different number of ranks: ranks are separate processes (RANK/WORLD_SIZE set as torchrun does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = str(Path(__file__).with_name("_rank_worker.py"))


def run_ranks(world, args_for_rank, tmp_path):
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        procs.append(subprocess.Popen([sys.executable, WORKER, *args_for_rank(rank)], env=env))
    for p in procs:
        assert p.wait(timeout=300) == 0


@pytest.mark.dist
@pytest.mark.slow
def test_resume_on_fewer_ranks_sees_each_sample_once(mds_folder, tokenizer_dir, tmp_path):
    from llmfoundry.data.streaming_guard import import_streaming

    total = len(import_streaming().StreamingDataset(local=str(mds_folder)))
    base = [str(mds_folder), str(tokenizer_dir)]
    run_ranks(2, lambda r: [*base, str(tmp_path / f"r{r}.json"), "3", "-"], tmp_path)
    first = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    state = first[0]["state"]
    assert state["sample_in_epoch"] == 2 * 3 * 2  # ranks x steps x batch
    (tmp_path / "state.json").write_text(json.dumps(state))
    run_ranks(1, lambda r: [*base, str(tmp_path / "resumed.json"), "-1", str(tmp_path / "state.json")], tmp_path)
    resumed = json.loads((tmp_path / "resumed.json").read_text())["rows"]
    seen = [tuple(row) for part in first for row in part["rows"]] + [tuple(row) for row in resumed]

    # An uninterrupted single-rank epoch with the same settings (streaming pads an epoch to whole partitions by
    # repeating a few samples, so compare against what an uninterrupted run sees, sample for sample).
    from collections import Counter

    from llmfoundry.data.text import TextDatasetSettings, TextLoaderSettings, build_text_dataloader
    from llmfoundry.data.tokenizers import build_tokenizer

    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(mds_folder), max_seq_len=32, shuffle=True,
                                                              shuffle_seed=5, num_canonical_nodes=2), drop_last=False)
    whole = [tuple(r) for b in build_text_dataloader(settings, build_tokenizer(str(tokenizer_dir), {}), 2)
             for r in b["input_ids"].tolist()]
    assert Counter(seen) == Counter(whole)
    every = {tuple(int(t) for t in import_streaming().StreamingDataset(local=str(mds_folder))[i]["tokens"])
             for i in range(total)}
    assert set(seen) == every and len(seen) - total <= 2
