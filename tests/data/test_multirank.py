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


def write_unique_samples(folder, count):
    """An MDS dataset of ``count`` distinct 32-token samples (sample i starts with token i)."""
    import numpy as np

    from llmfoundry.data.streaming_guard import import_streaming

    with import_streaming().MDSWriter(columns={"tokens": "ndarray:uint16:32"}, out=str(folder)) as writer:
        for i in range(count):
            writer.write({"tokens": (np.arange(32) + i).astype(np.uint16)})
    return [tuple(range(i, i + 32)) for i in range(count)]


@pytest.mark.dist
@pytest.mark.slow
def test_resume_on_fewer_ranks_sees_each_sample_once(tokenizer_dir, tokenizer, tmp_path):
    from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
    from llmfoundry.data.text import build_text_dataloader

    # streaming pads an epoch by repeating samples (never by dropping) in two places: the samples are split into
    # num_canonical_nodes equal rows (a short row repeats its last sample), and each node's samples into equal
    # shares for its ranks. The worker/batch padding uses -1 and is dropped, and our resume state is the global
    # sample position, which adds no repeat. So with num_canonical_nodes=2 (as in _rank_worker.py) on 2 ranks, then
    # 1, an even number of samples is seen exactly once; an odd one repeats one sample even without any resume:
    odd = write_unique_samples(tmp_path / "odd", 223)
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(tmp_path / "odd"), max_seq_len=32,
                                                              shuffle=True, shuffle_seed=5, num_canonical_nodes=2),
                                  drop_last=False)
    padded = [tuple(r) for b in build_text_dataloader(settings, tokenizer, 2) for r in b["input_ids"].tolist()]
    assert len(padded) == len(odd) + 1 and set(padded) == set(odd)

    samples = write_unique_samples(tmp_path / "even", 224)
    base = [str(tmp_path / "even"), str(tokenizer_dir)]
    run_ranks(2, lambda r: [*base, str(tmp_path / f"r{r}.json"), "3", "-"], tmp_path)
    first = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    state = first[0]["state"]
    assert state == first[1]["state"] and state["sample_in_epoch"] == 2 * 3 * 2  # ranks x steps x batch
    (tmp_path / "state.json").write_text(json.dumps(state))
    run_ranks(1, lambda r: [*base, str(tmp_path / "resumed.json"), "-1", str(tmp_path / "state.json")], tmp_path)
    resumed = json.loads((tmp_path / "resumed.json").read_text())["rows"]
    seen = [tuple(row) for part in first for row in part["rows"]] + [tuple(row) for row in resumed]
    assert len(first[0]["rows"]) == len(first[1]["rows"]) == 6
    # every sample of the epoch exactly once: nothing repeated, nothing skipped
    assert sorted(seen) == sorted(samples)
