"""Times in tok and sp counted as Composer counts them (real tokens of the attention mask), and packed finetuning
runs that resume exactly with the rows carried over between batches."""

from __future__ import annotations

import math

import torch

from llmfoundry.core.timeunits import Time, counted_interval, estimated_last_batch, interval_due
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainTime
from tests.helpers import make_trainer, tiny_recipe, weights, write_prompt_response_jsonl


def test_an_interval_in_tokens_is_due_at_each_batch_that_passes_a_multiple_of_it():
    interval = Time(1000, "tok")
    passes = [interval_due(1, interval, TrainTime(token=(b - 1) * 512), TrainTime(batch=b, token=b * 512))
              for b in range(1, 9)]
    # 512 tokens a batch: 1000, 2000, 3000 and 4000 are passed at batches 2, 4, 6 and 8 (not every 2 batches in
    # general: 20000 falls in batch 40 and 21000 in batch 42, 22000 in batch 43)
    assert passes == [False, True, False, True, False, True, False, True]
    assert interval_due(1, interval, TrainTime(token=42 * 512), TrainTime(batch=43, token=43 * 512))
    assert interval_due(3, None, TrainTime(batch=5), TrainTime(batch=6)) and not interval_due(
        3, None, TrainTime(batch=6), TrainTime(batch=7))


def test_a_dur_interval_with_max_duration_in_tokens_only_comes_at_the_end_as_in_composer():
    assert counted_interval("0.5dur", "4000tok").value == math.inf
    assert counted_interval("0.5dur", "8ba") is None and counted_interval("100sp", "8ba") == Time(100, "sp")


def test_the_last_batch_of_a_max_duration_in_tokens_follows_the_tokens_trained():
    end = Time(2000, "tok")
    assert estimated_last_batch(end, TrainTime(), 512) == 4  # before any batch: the nominal batch shape
    assert estimated_last_batch(end, TrainTime(batch=3, token=900), 512) == 7  # 300 real tokens a batch
    assert estimated_last_batch(end, TrainTime(batch=7, token=2010), 512) == 7  # reached: this batch ends it


class TokenLog(Callback):
    def __init__(self):
        self.tokens: list[int] = []
        self.evals: list[int] = []

    def on_batch_end(self, trainer, metrics):
        self.tokens.append(trainer.time.token)

    def on_eval_end(self, trainer, metrics):
        self.evals.append(trainer.time.batch)


def _finetuning(tmp_path, corpus, **dataset) -> dict:
    data = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus)
    return {"name": "finetuning", "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": {"train": str(data)}},
                                             "split": "train", "max_seq_len": 64, "shuffle": True,
                                             "shuffle_seed": 3, **dataset}, "drop_last": True}


def test_max_duration_eval_and_save_intervals_in_tokens_count_real_tokens_on_padded_data(
        mds_root, tokenizer_dir, corpus, tmp_path):
    loader = _finetuning(tmp_path, corpus)
    recipe = tiny_recipe(mds_root, tokenizer_dir, train_loader=loader, eval_loader=None, max_duration="1500tok",
                         eval_interval="500tok", save_interval="700tok", save_folder=str(tmp_path / "ckpt"),
                         eval_loaders=[{"label": "ft", **loader, "dataset": {**loader["dataset"], "shuffle": False}}],
                         eval_subset_num_batches=1, scheduler={"name": "constant_with_warmup", "t_warmup": "0tok"})
    trainer = make_trainer(recipe)
    log = TokenLog()
    trainer.callbacks.append(log)
    trainer.fit()
    tokens = log.tokens
    assert tokens[-1] >= 1500 > tokens[-2]  # ends at the first batch whose real tokens reach max_duration
    assert len(tokens) > math.ceil(1500 / (8 * 64))  # more batches than the padded batch shape would give
    before = [0] + tokens[:-1]
    crossed = [b for b, (t0, t1) in enumerate(zip(before, tokens), start=1) if t0 // 500 != t1 // 500]
    assert log.evals == crossed + ([len(tokens)] if crossed[-1] != len(tokens) else [])
    saves = [b for b, (t0, t1) in enumerate(zip(before, tokens), start=1) if t0 // 700 != t1 // 700]
    saved = sorted(int(p.name.split("ba")[1]) for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ep"))
    assert saved == sorted(set(saves) | {len(tokens)})


def test_a_packed_run_resumed_mid_epoch_trains_the_same_batches(mds_root, tokenizer_dir, corpus, tmp_path):
    loader = _finetuning(tmp_path, corpus, packing_ratio=2.5)
    recipe = tiny_recipe(mds_root, tokenizer_dir, train_loader=loader, eval_loader=None, max_duration="4ba",
                         save_interval="2ba", save_folder=str(tmp_path / "a"))
    straight = make_trainer(recipe)
    straight.fit()
    saved = torch.load(tmp_path / "a" / "ep0-ba2" / "rank0.pt", weights_only=True)["dataloader"]
    assert any(saved["leftover_bins"][0])  # rows were carried over at the interruption
    resumed = make_trainer({**recipe, "save_folder": None, "load_path": str(tmp_path / "a" / "ep0-ba2")})
    assert resumed.time.batch == 2
    resumed.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)

