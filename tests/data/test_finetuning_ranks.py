"""The finetuning loader deals examples to ranks as llm-foundry's torch DistributedSampler does, including its
padding of the last partial batch with ``drop_last: false`` (ranks from RANK/WORLD_SIZE, no process group)."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.core.dist import DataShare
from tests.data.test_finetuning import build
from tests.helpers import write_prompt_response_jsonl


def _sampler_rows(dataset, rank: int, world: int, batch: int, drop_last: bool) -> list[list[list[int]]]:
    """Rank ``rank``'s batches (as input_ids lists) under torch's DistributedSampler + a batch sampler, as
    llm-foundry builds its finetuning loader (Composer's dist.get_sampler, seed 0, shuffle)."""
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0,
                                                  drop_last=drop_last)
    batches = torch.utils.data.BatchSampler(sampler, batch, drop_last=drop_last)
    return [[dataset[i]["input_ids"] for i in indices] for indices in batches]


def _loader_rows(loader) -> list[list[list[int]]]:
    out = []
    for b in loader:
        out.append([row[mask.bool()].tolist() for row, mask in zip(b["input_ids"], b["attention_mask"])])
    return out


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_get_distributed_samplers_batches_including_its_padding(tmp_path, corpus, tokenizer, monkeypatch,
                                                                          drop_last):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:21])
    monkeypatch.setenv("WORLD_SIZE", "2")
    per_rank = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = build(path, tokenizer, batch=4, drop_last=drop_last, max_seq_len=128, shuffle=True)
        n = len(loader.dataset)
        assert n == 21  # odd: DistributedSampler pads one example; 11 per rank: a partial last batch of 3
        got = _loader_rows(loader)
        assert got == _sampler_rows(loader.dataset, rank, 2, 4, drop_last)
        assert len(got) == len(loader)
        per_rank[rank] = got
    sizes = [[len(b) for b in per_rank[r]] for r in (0, 1)]
    assert sizes[0] == sizes[1]  # every rank runs the same number of equally long batches
    if not drop_last:
        assert sizes[0] == [4, 4, 3]  # the partial last batch is kept, as long on both ranks
        seen = [tuple(row) for r in (0, 1) for b in per_rank[r] for row in b]
        assert len(seen) == len(set(seen)) + 1  # one example repeated: the padding


def test_the_share_handed_to_the_builder_decides_which_examples_a_loader_deals(tmp_path, corpus, tokenizer,
                                                                               monkeypatch):
    """A loader built outside the trainer (a tool, a Ray worker) gets its share as an argument: the ranks of a
    tensor-parallel group (replication 2 of 4 ranks) see the same examples, whatever RANK says; without a share
    a loader deals by its own world rank."""
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:24])
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")  # world rank 3 = data-parallel rank 1 of 2 in a TP group of 2
    shared = _loader_rows(build(path, tokenizer, share=DataShare(rank=1, size=2, replication=2), shuffle=True))
    own = _loader_rows(build(path, tokenizer, shuffle=True))
    dataset = build(path, tokenizer, shuffle=True).dataset
    assert shared == _sampler_rows(dataset, 1, 2, 4, drop_last=True)
    assert own == _sampler_rows(dataset, 3, 4, 4, drop_last=True) and own != shared
