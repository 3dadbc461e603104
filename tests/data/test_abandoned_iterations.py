"""An iteration abandoned before the epoch's end stops its epoch's background threads (data/text.py's
EndsAbandonedEpochs). streaming alone leaves its prepare/ready threads polling every few milliseconds until the
process ends: an eval loader cut short at every eval round, or a test suite that takes one batch of hundreds of
loaders, slowed down with each."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
from llmfoundry.data.loader_settings import (
    FinetuningDatasetSettings,
    FinetuningLoaderSettings,
    TextDatasetSettings,
    TextLoaderSettings,
)
from llmfoundry.data.text import build_text_dataloader
from tests.data.test_finetuning import chat_jsonl


def _threads_settle_at(limit: int, timeout: float = 10.0, collect: bool = True) -> int:
    deadline = time.monotonic() + timeout
    while True:
        if collect:
            gc.collect()  # the loaders' datasets (and with them their thread pools) are unreachable once dropped
        count = threading.active_count()
        if count <= limit or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.fixture(scope="module")
def finetuning_mds(tmp_path_factory, corpus, tokenizer_dir):
    from llmfoundry.data.prep.cli import main

    folder = tmp_path_factory.mktemp("ft")
    path = chat_jsonl(folder / "chat.jsonl", corpus, n=40)
    assert main(["finetuning", "--dataset", str(path), "--out_root", str(folder / "mds"), "--tokenizer",
                 str(tokenizer_dir), "--max_seq_len", "128", "--splits", "train"]) == 0
    return folder / "mds"


def _text_loader(mds_folder, tokenizer):
    dataset = TextDatasetSettings(local=str(mds_folder), max_seq_len=32, shuffle=True)
    return build_text_dataloader(TextLoaderSettings(dataset=dataset), tokenizer, 2)


def _finetuning_loader(finetuning_mds, tokenizer):
    dataset = FinetuningDatasetSettings(local=str(finetuning_mds), split="train", max_seq_len=128)
    return build_finetuning_dataloader(FinetuningLoaderSettings(dataset=dataset), tokenizer, 2)


@pytest.mark.parametrize("make", [_text_loader, _finetuning_loader], ids=["text", "finetuning"])
def test_abandoned_iterations_leave_no_thread_behind(make, mds_folder, finetuning_mds, tokenizer):
    source = mds_folder if make is _text_loader else finetuning_mds
    before = _threads_settle_at(threading.active_count())
    for _ in range(5):  # five loaders, one batch taken from each, then dropped
        loader = make(source, tokenizer)
        batch = next(iter(loader))
        assert batch["input_ids"].shape[0] == 2
        del loader, batch
    assert _threads_settle_at(before) <= before


def test_a_new_iteration_of_the_same_loader_is_not_stopped_by_the_abandoned_one(mds_folder, tokenizer):
    loader = _text_loader(mds_folder, tokenizer)
    first = iter(loader)
    next(first)
    second = iter(loader)  # a new epoch (what the next eval round does) while the first is still referenced
    rows = [next(second) for _ in range(3)]
    del first  # the abandoned one ends now, after the second began: the second goes on to its end
    gc.collect()
    assert len(rows) + len(list(second)) == len(loader)


def test_a_loader_kept_alive_holds_no_thread_between_its_iterations(mds_folder, tokenizer):
    """A trainer keeps its loaders for the whole run: neither a finished epoch nor an abandoned one may leave the
    epoch's thread pool (idle workers, one per started thread) alive until the next epoch or the loader's end."""
    loader = _text_loader(mds_folder, tokenizer)
    before = _threads_settle_at(threading.active_count())
    for _ in range(3):
        abandoned = iter(loader)
        next(abandoned)
        del abandoned
        assert sum(1 for _ in loader) == len(loader)  # a whole epoch
    assert _threads_settle_at(before, collect=False) <= before
