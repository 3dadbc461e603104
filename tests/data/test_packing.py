"""llm-foundry's packing rule (largest first, rows that do not fit carried into the next batch) in the finetuning
loader, and exact resumption with the carried-over rows in the loader's state."""

from __future__ import annotations

import json

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
from llmfoundry.data.loader_settings import FinetuningDatasetSettings, FinetuningLoaderSettings
from llmfoundry.data.packing import BinPacker, auto_packing_ratio, candidate_ratios
from llmfoundry.data.text import IGNORE_INDEX
from llmfoundry.train.recipe import validate
from tests.helpers import write_prompt_response_jsonl


def test_packs_largest_first_into_the_first_bin_that_fits_and_returns_the_fullest_rows_first():
    packer = BinPacker(rows=2, max_seq_len=10)
    # 6 and 5 open a bin each; 4 joins the 6 (which moves to the end of the bin list), 3 joins the 5
    assert packer.pack([3, 6, 5, 4], [0, 1, 2, 3]) == [[1, 3], [2, 0]]
    assert packer.leftovers == []


def test_rows_that_do_not_fit_a_batch_are_carried_into_the_next_one():
    packer = BinPacker(rows=1, max_seq_len=10)
    assert packer.pack([6, 5], ["a", "b"]) == [["a"]]
    assert packer.leftovers == [(5, ["b"])]
    assert packer.pack([4], ["c"]) == [["b", "c"]]  # the carried row takes the next batch's example

    keep_none = BinPacker(rows=1, max_seq_len=10, max_leftover_bins_to_keep=0)
    keep_none.pack([6, 5], ["a", "b"])
    assert keep_none.pack([4], ["c"]) == [["c"]] and keep_none.waste > 0


def test_auto_packing_ratio_is_the_largest_candidate_without_waste():
    assert candidate_ratios(200, 2) == [1.0, 1.5, 2.0]  # one ratio per number of examples a batch draws
    assert auto_packing_ratio([50] * 400, 200, 2) == 2.0  # four 50-token examples fill a 200-token row
    assert auto_packing_ratio([150] * 400, 200, 2) == 1.0  # three 150-token examples leave one carried over
    assert auto_packing_ratio([10] * 400, 100, 2) == 1.0  # max_seq_len <= 100: llm-foundry does not profile


def _loader(path, tokenizer, batch=4, **dataset):
    dataset = {"max_seq_len": 64, "shuffle": True, "shuffle_seed": 5, **dataset}
    ds = FinetuningDatasetSettings(hf_name="json", hf_kwargs={"data_files": str(path)}, split="train", **dataset)
    return build_finetuning_dataloader(FinetuningLoaderSettings(dataset=ds), tokenizer, batch)


def test_packed_rows_are_full_length_and_no_label_crosses_into_the_next_example(tmp_path, corpus, tokenizer):
    path = tmp_path / "pr.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": "a b", "response": " c"}) for _ in range(8)))
    batch = next(iter(_loader(path, tokenizer, batch=2, packing_ratio=4, allow_pad_trimming=True,
                              target_prompts="all")))
    example = len(tokenizer("a b")["input_ids"]) + len(tokenizer(" c", add_special_tokens=False)["input_ids"]) + 1
    assert batch["input_ids"].shape == (2, 64)  # packed rows are max_seq_len long, as llm-foundry's
    # equal sizes: the first row takes examples until only one is left for the other (llm-foundry's rule)
    assert batch["sequence_id"][1].tolist() == [0] * example + [-1] * (64 - example)
    seq, labels = batch["sequence_id"][0], batch["labels"][0]
    assert seq.tolist() == [n for n in range(7) for _ in range(example)] + [-1] * (64 - 7 * example)
    assert all(labels[n * example + 1] != IGNORE_INDEX for n in range(7))  # target_prompts: all

    # an example's first label (which its predecessor's last token would learn) is never a target once packed
    collator = _loader(path, tokenizer, batch=1, packing_ratio=2).collator
    packed = collator.packed([[{"input_ids": [5, 6], "labels": [5, 6]}, {"input_ids": [7, 8], "labels": [7, 8]}]])
    assert packed["labels"][0, :4].tolist() == [5, 6, IGNORE_INDEX, 8]
    assert packed["sequence_id"][0, :5].tolist() == [0, 0, 1, 1, -1]


def test_packing_ratio_one_is_no_packing_as_in_llm_foundry(tmp_path, corpus, tokenizer):
    loader = _loader(write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus), tokenizer, packing_ratio=1.0)
    assert "sequence_id" not in next(iter(loader)) and loader.packing is None


@pytest.mark.parametrize("stop", ["mid-epoch", "epoch end", "second epoch"])
def test_resumed_loader_with_carried_over_rows_yields_the_same_batches(tmp_path, corpus, tokenizer, stop):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus)
    straight = _loader(path, tokenizer, packing_ratio=2.5)
    per_epoch = len(straight)
    full = [b for _ in range(2) for b in straight]  # carried-over rows also cross into the next epoch
    stop_after = {"mid-epoch": 3, "epoch end": per_epoch, "second epoch": per_epoch + 2}[stop]

    interrupted = _loader(path, tokenizer, packing_ratio=2.5)
    seen = 0
    while seen < stop_after:
        for _ in interrupted:
            seen += 1
            if seen == stop_after:
                break
    state = json.loads(json.dumps(interrupted.state_dict()))  # plain data, as a checkpoint keeps it
    assert any(bins for per_rank in state["leftover_bins"] for bins in per_rank)  # rows were carried over
    resumed = _loader(path, tokenizer, packing_ratio=2.5)
    resumed.load_state_dict(state)
    rest = []
    while resumed.epoch < 2:
        rest += list(resumed)
    assert len(rest) == len(full) - stop_after
    for a, b in zip(rest, full[stop_after:]):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_ranks_get_their_examples_as_llm_foundrys_distributed_sampler_deals_them(tmp_path, corpus, tokenizer,
                                                                                 monkeypatch):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus)
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = _loader(path, tokenizer, packing_ratio=2.5)  # 10 examples per rank and batch
        ours = [i for _, mine in loader._index_batches(0) for i in mine]
        sampler = torch.utils.data.DistributedSampler(loader.dataset, num_replicas=2, rank=rank, shuffle=True,
                                                      seed=5, drop_last=True)
        theirs = list(sampler)
        assert ours == theirs[: len(ours)] and len(ours) == len(theirs) // 10 * 10


def test_max_leftover_bins_to_keep_without_packing_is_an_error_as_in_llm_foundry():
    with pytest.raises(ConfigError) as caught:
        validate({"dataset": {"hf_name": "json", "max_leftover_bins_to_keep": 2}}, FinetuningLoaderSettings,
                 "train_loader")
    assert caught.value.problems == ["train_loader.dataset.max_leftover_bins_to_keep: needs packing_ratio set and a "
                                     "value >= 0 (got 2, packing_ratio None); set both or remove it"]
    settings = validate({"dataset": {"hf_name": "json", "packing_ratio": 2, "max_leftover_bins_to_keep": 0,
                                     "auto_packing_replication": 1}}, FinetuningLoaderSettings, "train_loader")
    assert settings.dataset.max_leftover_bins_to_keep == 0
