"""The ``finetuning`` loader: tokenized examples (from records, see finetuning.py, or MDS shards written by
``convert_finetuning_dataset.py``) -> padded or packed batches with a resumable global sample position.

With packing (``packing_ratio``), several examples share a row: ``sequence_id`` numbers them and no label crosses
from one example into the next. The loader's state is a global sample position, so resuming on any number of
ranks works.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import numpy as np
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning import FinetuningDataset, FinetuningDatasetSettings, FinetuningLoaderSettings
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import IGNORE_INDEX, dataloader_kwargs, make_streaming_dataset
from llmfoundry.registry import dataloaders

log = logging.getLogger(__name__)
streaming = import_streaming()  # through the guard: streaming must import without a working torchvision


class StreamingFinetuningDataset(streaming.StreamingDataset):
    """MDS samples of ``input_ids`` and ``labels`` (what convert_finetuning_dataset.py writes), as int lists."""

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        sample = super().__getitem__(index)
        if "input_ids" not in sample or "labels" not in sample:
            raise ConfigError(f"finetuning MDS samples need input_ids and labels (have {sorted(sample)}); "
                              "write them with data_prep/convert_finetuning_dataset.py")
        return {k: np.asarray(sample[k]).astype(np.int64).tolist() for k in ("input_ids", "labels")}


# ----------------------------------------------------------------------------------------------- batches
def first_fit(lengths: list[int], capacity: int, rows: int) -> tuple[list[list[int]], list[int]]:
    """First-fit packing of examples (by index, in order) into ``rows`` bins; returns (bins, dropped indices)."""
    bins: list[list[int]] = []
    space: list[int] = []
    dropped = []
    for i, length in enumerate(lengths):
        for b, free in enumerate(space):
            if length <= free:
                bins[b].append(i)
                space[b] -= length
                break
        else:
            if len(bins) < rows:
                bins.append([i])
                space.append(capacity - length)
            else:
                dropped.append(i)
    return bins, dropped


class FinetuningCollator:
    """Pads (or packs, first-fit) examples into a batch of ``rows`` rows."""

    def __init__(self, ds: FinetuningDatasetSettings, pad_token_id: int, rows: int, packing: bool):
        self.max_seq_len = ds.max_seq_len
        self.pad = pad_token_id
        self.rows = rows
        self.packing = packing
        self.trim = ds.allow_pad_trimming
        self.decoder_only = ds.decoder_only_format
        self.num_dropped = 0  # examples that did not fit while packing

    def _tensor(self, rows: list[list[int]], fill: int, length: int) -> torch.Tensor:
        out = torch.full((len(rows), length), fill, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        if not self.decoder_only:
            length = self.max_seq_len if not self.trim else max(len(e["input_ids"]) for e in examples)
            label_length = self.max_seq_len if not self.trim else max(len(e["labels"]) for e in examples)
            ids = [e["input_ids"] for e in examples]
            return {
                "input_ids": self._tensor(ids, self.pad, length),
                "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, length),
                "labels": self._tensor([e["labels"] for e in examples], IGNORE_INDEX, label_length),
            }
        if self.packing:
            bins, dropped = first_fit([len(e["input_ids"]) for e in examples], self.max_seq_len, self.rows)
            if dropped:
                if not self.num_dropped:
                    log.warning("packing: %d examples did not fit into a batch and were skipped; lower "
                                "packing_ratio (auto avoids this for the first epoch)", len(dropped))
                self.num_dropped += len(dropped)
            bins += [[] for _ in range(self.rows - len(bins))]  # always `rows` rows (an empty one is all padding)
        else:
            bins = [[i] for i in range(len(examples))]
        ids, labels, seq = [], [], []
        for members in bins:
            ids.append([t for i in members for t in examples[i]["input_ids"]])
            labels.append([t for i in members for t in examples[i]["labels"]])
            seq.append([n for n, i in enumerate(members) for _ in examples[i]["input_ids"]])
        length = max(1, max(len(r) for r in ids)) if self.trim else self.max_seq_len
        batch = {
            "input_ids": self._tensor(ids, self.pad, length),
            "labels": self._tensor(labels, IGNORE_INDEX, length),
            "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, length),
        }
        if self.packing:
            batch["sequence_id"] = self._tensor(seq, -1, length)
        return batch


def auto_packing_ratio(lengths: list[int], max_seq_len: int, batch_size: int, *, max_ratio: float = 20.0) -> float:
    """The largest packing ratio for which first-fit packing drops no example of ``lengths``.

    ``lengths`` are the example lengths in epoch order (at most the first 20,000 are profiled); each batch of
    ``ceil(batch_size * ratio)`` consecutive examples must fit into ``batch_size`` rows of ``max_seq_len``.
    """
    sample = lengths[:20000]

    def wastes(ratio: float) -> bool:
        per_batch = max(batch_size, math.ceil(batch_size * ratio))
        for start in range(0, len(sample), per_batch):
            _, dropped = first_fit(sample[start : start + per_batch], max_seq_len, batch_size)
            if dropped:
                return True
        return False

    ratio, step = 1.0, 1.0
    while step >= 1 / batch_size - 1e-9:  # finer steps than 1/batch_size change nothing
        if ratio + step <= max_ratio and not wastes(ratio + step):
            ratio += step
        else:
            step /= 2
    return round(ratio, 4)


class FinetuningLoader:
    """Batches of finetuning examples with a resumable global sample position.

    Each epoch is a seeded permutation of the examples (or their order, without shuffle); step ``s`` of rank ``r``
    takes examples ``[(s * world + r) * n, ... + n)`` of it, where ``n`` is the examples per rank and batch.
    ``state_dict()`` is ``{"epoch", "sample_in_epoch"}`` counted over all ranks, so resuming with another world
    size continues at the same example.

    One torch DataLoader serves every epoch: its batch sampler (in this process) hands out the current epoch's index
    batches, so with ``persistent_workers`` the worker processes live across epochs.
    """

    def __init__(self, dataset, collator, examples_per_batch: int, settings: FinetuningLoaderSettings):
        self.dataset = dataset
        self.collator = collator
        self.examples_per_batch = examples_per_batch
        self.packing_ratio: float | None = None  # examples per row; the builder sets it when packing
        self.shuffle = settings.dataset.shuffle
        self.seed = settings.dataset.shuffle_seed
        self.drop_last = settings.drop_last
        self.epoch = 0
        self.sample_in_epoch = 0
        self._resume_from: int | None = None
        self._sampler = _EpochBatchSampler()
        kwargs = dataloader_kwargs(settings)
        kwargs.pop("drop_last")  # the sampler drops the last incomplete batch itself
        self.dataloader = torch.utils.data.DataLoader(dataset, batch_sampler=self._sampler, collate_fn=collator,
                                                      **kwargs)

    @staticmethod
    def _world() -> tuple[int, int]:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def __len__(self) -> int:
        _, world = self._world()
        per_step = self.examples_per_batch * world
        return len(self.dataset) // per_step if self.drop_last else math.ceil(len(self.dataset) / per_step)

    def _index_batches(self, start: int) -> list[tuple[int, list[int]]]:
        """(global position after the step, this rank's example indices) for each step of the epoch from ``start``."""
        rank, world = self._world()
        order = self._order(self.epoch)
        per_step = self.examples_per_batch * world
        batches = []
        for position in range(start, len(order), per_step):
            chunk = order[position : position + per_step]
            if len(chunk) < per_step and self.drop_last:
                break
            mine = chunk[rank * self.examples_per_batch : (rank + 1) * self.examples_per_batch]
            batches.append((position + len(chunk), mine))
        return batches

    def __iter__(self):
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        index_batches = self._index_batches(start)
        self._sampler.batches = [mine for _, mine in index_batches]
        self.sample_in_epoch = start
        for batch, (end, _) in zip(self.dataloader, index_batches):  # the loader first: it ends its own epoch
            self.sample_in_epoch = end
            yield batch
        self.epoch += 1
        self.sample_in_epoch = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch, "shuffle_seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.sample_in_epoch = int(state["sample_in_epoch"])
        self._resume_from = self.sample_in_epoch


class _EpochBatchSampler(torch.utils.data.Sampler):
    """The index batches of the epoch being iterated (set by FinetuningLoader before each epoch)."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(list(self.batches))


@dataloaders.register("finetuning", config=FinetuningLoaderSettings)
def build_finetuning_dataloader(settings: FinetuningLoaderSettings, tokenizer, device_batch_size: int, *,
                                key: str = "train_loader"):
    """Batches of the validated ``settings`` (see FinetuningDatasetSettings.check_settings for what is checked)."""
    ds = settings.dataset
    if tokenizer is None or tokenizer.eos_token_id is None:
        raise ConfigError("tokenizer.name: the finetuning loader needs a tokenizer with an EOS token")
    pad = ds.pad_token_id
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ratio = ds.packing_ratio
    if ds.is_mds:
        per_batch = device_batch_size if ratio is None else max(device_batch_size, math.ceil(device_batch_size * float(ratio)))
        dataset = make_streaming_dataset(StreamingFinetuningDataset, ds, per_batch, f"{key}.dataset")
        collator = FinetuningCollator(ds, pad, device_batch_size, packing=ratio is not None)
        return streaming.StreamingDataLoader(dataset, batch_size=per_batch, collate_fn=collator,
                                             **dataloader_kwargs(settings))
    dataset = FinetuningDataset(tokenizer, ds, f"{key}.dataset")
    collator = FinetuningCollator(ds, pad, device_batch_size, packing=ratio is not None)
    loader = FinetuningLoader(dataset, collator, device_batch_size, settings)
    if ratio == "auto":
        order = loader._order(0)
        ratio = auto_packing_ratio([len(dataset.examples[i]["input_ids"]) for i in order], ds.max_seq_len,
                                   device_batch_size)
        print(f"{key}.dataset.packing_ratio: auto chose {ratio}", flush=True)
    if ratio is not None:
        loader.examples_per_batch = max(device_batch_size, math.ceil(device_batch_size * float(ratio)))
    loader.packing_ratio = ratio
    return loader
