"""The ``finetuning`` loader: tokenized examples (from records, see finetuning.py, or MDS shards written by
``convert_finetuning_dataset.py``) -> padded or packed batches (data/finetuning_collator.py) with a resumable
global sample position.

With packing (``packing_ratio``), several examples share a row, packed by llm-foundry's rule (data/packing.py:
largest first, rows that do not fit a batch carried into the next): ``sequence_id`` numbers them and no label
crosses from one example into the next. The loader's state is a global sample position (so resuming on any number
of ranks works) plus, when packing, the rows carried over, as example ids.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.data.finetuning import FinetuningDataset
from llmfoundry.data.finetuning_collator import FinetuningCollator
from llmfoundry.data.loader_settings import FinetuningLoaderSettings
from llmfoundry.data.packing import BinPacker, auto_packing_ratio, examples_per_batch, profiled_example_count
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import EndsAbandonedEpochs, dataloader_kwargs, make_streaming_dataset

log = logging.getLogger(__name__)
streaming = import_streaming()  # through the guard: streaming must import without a working torchvision


class StreamingFinetuningDataset(EndsAbandonedEpochs, streaming.StreamingDataset):
    """MDS samples of ``input_ids`` and ``labels`` (what convert_finetuning_dataset.py writes), as int lists."""

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        sample = super().__getitem__(index)
        if "input_ids" not in sample or "labels" not in sample:
            raise ConfigError(f"finetuning MDS samples need input_ids and labels (have {sorted(sample)}); "
                              "write them with data_prep/convert_finetuning_dataset.py")
        return {k: np.asarray(sample[k]).astype(np.int64).tolist() for k in ("input_ids", "labels")}


class PackingState:
    """llm-foundry's packers with the examples their carried-over bins hold, one packer per place llm-foundry
    keeps a collator: the process, or each DataLoader worker (batch k of an epoch goes to worker k % workers).

    Without persistent workers llm-foundry's workers start each epoch from a fresh copy of the collator, so their
    carried-over bins are gone; with none or persistent ones the bins carry over into the next epoch.
    """

    def __init__(self, collator: FinetuningCollator, max_leftover_bins_to_keep: int | None, num_workers: int,
                 persistent_workers: bool):
        self.collator = collator
        self.keep = max_leftover_bins_to_keep
        self.slots = max(1, num_workers)
        self.reset_each_epoch = num_workers > 0 and not persistent_workers
        self.packers = [BinPacker(collator.rows, collator.max_seq_len, self.keep) for _ in range(self.slots)]
        self.examples: dict[int, dict[str, list[int]]] = {}  # example id -> example, for carried-over bins

    def start_epoch(self) -> None:
        if self.reset_each_epoch:
            self.packers = [BinPacker(self.collator.rows, self.collator.max_seq_len, self.keep)
                            for _ in range(self.slots)]
            self.examples = {}

    def pack(self, batch_in_epoch: int, examples: list[dict[str, list[int]]], ids: list[int]) -> dict[str, torch.Tensor]:
        self.examples.update(zip(ids, examples))
        packer = self.packers[batch_in_epoch % self.slots]
        before = sum(len(m) for _, m in packer.leftovers) + len(ids)
        bins = packer.pack([len(e["input_ids"]) for e in examples], ids)
        self.collator.num_dropped += before - sum(map(len, bins)) - sum(len(m) for _, m in packer.leftovers)
        kept = {i for p in self.packers for _, members in p.leftovers for i in members}
        batch = self.collator.packed([[self.examples[i] for i in members] for members in bins])
        self.examples = {i: e for i, e in self.examples.items() if i in kept}
        return batch

    def state_dict(self) -> list[list[list[int]]]:
        """Each packer's carried-over bins as lists of example ids (their sizes follow from the examples)."""
        return [[list(members) for _, members in packer.leftovers] for packer in self.packers]

    def load_state_dict(self, leftovers: list[list[list[int]]], fetch) -> None:
        """Restore the carried-over bins; ``fetch(id)`` reads an example again."""
        for packer, bins in zip(self.packers, leftovers):
            for members in bins:
                self.examples.update({i: fetch(i) for i in members if i not in self.examples})
            packer.leftovers = [(sum(len(self.examples[i]["input_ids"]) for i in members), list(members))
                                for members in bins]


class StreamPackingCollator:
    """The packing collator of MDS loaders (streaming's loader runs it, in each worker): examples get running ids.
    Its carried-over bins are not part of the loader's state, as in llm-foundry (a resumed run starts without)."""

    def __init__(self, state: PackingState):
        self.state = state
        self.count = 0

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        ids = list(range(self.count, self.count + len(examples)))
        self.count += len(examples)
        return self.state.pack(0, examples, ids)


def epoch_order(num_examples: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The examples' order in ``epoch``: a permutation seeded by ``seed + epoch``, or file order without shuffle."""
    if not shuffle:
        return list(range(num_examples))
    return torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def padded_for_ranks(order: list[int], size: int) -> list[int]:
    """DistributedSampler's ``drop_last: false``: the epoch's first examples repeated at its end until every rank
    has as many (so the last batch is as long on every rank, and no rank runs out of batches before the others)."""
    pad = -len(order) % size
    return order + (order * math.ceil(pad / len(order)))[:pad] if pad and order else order


def _keep_examples(examples: list[dict[str, list[int]]]) -> list[dict[str, list[int]]]:
    """The collate function while packing: the examples themselves (packed in the main process, which holds the
    carried-over bins so that a checkpoint can save them)."""
    return examples


class FinetuningLoader:
    """Batches of finetuning examples with a resumable global sample position.

    Each epoch is a seeded permutation of the examples (or their order, without shuffle); step ``s`` takes its
    ``n * world`` examples ``[s * n * world, (s + 1) * n * world)`` and rank ``r`` every ``world``-th of them from
    the ``r``-th (``n``: examples per rank and batch), which is how llm-foundry's DistributedSampler deals them; with
    ``drop_last: false`` the epoch is first padded as that sampler pads it (:func:`padded_for_ranks`).
    ``state_dict()`` is ``{"epoch", "sample_in_epoch"}`` counted over all ranks, so resuming with another world
    size continues at the same example; with packing it also holds every rank's carried-over bins (example ids).

    One torch DataLoader serves every epoch: its batch sampler (in this process) hands out the current epoch's index
    batches, so with ``persistent_workers`` the worker processes live across epochs.
    """

    def __init__(self, dataset, collator, examples_per_batch: int, settings: FinetuningLoaderSettings,
                 share: dist.DataShare, packing: PackingState | None = None, packing_ratio: float | None = None):
        self.dataset = dataset
        self.share = share  # this rank's share of the examples (data-parallel rank and size)
        self.collator = collator
        self.examples_per_batch = examples_per_batch
        self.packing = packing
        self.packing_ratio = packing_ratio  # examples per row (None: not packed)
        self.shuffle = settings.dataset.shuffle
        self.seed = settings.dataset.shuffle_seed
        self.drop_last = settings.drop_last
        self.epoch = 0
        self.sample_in_epoch = 0
        self._resume_from: int | None = None
        self._sampler = _EpochBatchSampler()
        kwargs = dataloader_kwargs(settings)
        kwargs.pop("drop_last")  # the sampler drops the last incomplete batch itself
        self.dataloader = torch.utils.data.DataLoader(
            dataset, batch_sampler=self._sampler, collate_fn=_keep_examples if packing else collator, **kwargs)

    def _order(self, epoch: int) -> list[int]:
        return epoch_order(len(self.dataset), self.shuffle, self.seed, epoch)

    def __len__(self) -> int:
        per_step = self.examples_per_batch * self.share.size
        return len(self.dataset) // per_step if self.drop_last else math.ceil(len(self.dataset) / per_step)

    def _index_batches(self, start: int) -> list[tuple[int, list[int]]]:
        """(global position after the step, this rank's example indices) for each step of the epoch from ``start``."""
        rank, size = self.share.rank, self.share.size
        order = self._order(self.epoch)
        if not self.drop_last:
            order = padded_for_ranks(order, size)
        per_step = self.examples_per_batch * size
        batches = []
        for position in range(start, len(order), per_step):
            chunk = order[position : position + per_step]
            if len(chunk) < per_step and self.drop_last:
                break
            mine = chunk[rank::size]
            batches.append((position + len(chunk), mine))
        return batches

    def __iter__(self):
        start = self._resume_from if self._resume_from is not None else 0
        if self._resume_from is None and self.packing is not None:
            self.packing.start_epoch()
        self._resume_from = None
        index_batches = self._index_batches(start)
        self._sampler.batches = [mine for _, mine in index_batches]
        self.sample_in_epoch = start
        first = start // (self.examples_per_batch * self.share.size)  # the batch's number in the epoch
        # the loader first: it ends its own epoch
        for number, (batch, (end, mine)) in enumerate(zip(self.dataloader, index_batches), start=first):
            if self.packing is not None:
                batch = self.packing.pack(number, batch, mine)
            self.sample_in_epoch = end
            yield batch
        self.epoch += 1
        self.sample_in_epoch = 0

    def state_dict(self) -> dict[str, Any]:
        """The position; with packing also each rank's carried-over bins (gathered: every rank calls this when a
        checkpoint is saved, and the checkpoint keeps rank 0's copy)."""
        state: dict[str, Any] = {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch,
                                 "shuffle_seed": self.seed}
        if self.packing is not None:
            mine = self.packing.state_dict()
            # one entry per data-parallel rank (the ranks of a tensor-parallel group carry the same bins)
            state["leftover_bins"] = dist.all_gather_object(mine)[:: self.share.replication]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.sample_in_epoch = int(state["sample_in_epoch"])
        self._resume_from = self.sample_in_epoch
        saved = state.get("leftover_bins")
        if self.packing is None or not saved:
            return
        rank, size = self.share.rank, self.share.size
        slots = self.packing.slots
        if len(saved) != size or any(len(per_rank) != slots for per_rank in saved):
            # another world size or num_workers: the bins are dealt out again, none is lost
            notice_once(f"train_loader.dataset.packing_ratio: resuming on {size} ranks x {slots} packers from "
                        f"{len(saved)} x {len(saved[0])}: the carried-over packing bins are dealt out again")
            pool = [members for per_rank in saved for per_slot in per_rank for members in per_slot]
            share = pool[rank::size]
            saved = {rank: [share[s::slots] for s in range(slots)]}
        self.packing.load_state_dict(saved[rank], lambda i: self.dataset[i])


class _EpochBatchSampler(torch.utils.data.Sampler):
    """The index batches of the epoch being iterated (set by FinetuningLoader before each epoch)."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(list(self.batches))


def _profiled_sizes(order: list[int], dataset, count: int, share: dist.DataShare) -> list[int]:
    """The lengths of this rank's first ``count`` examples of the epoch (what llm-foundry's profiling reads: the
    first batch of a loader of ``count`` examples per rank)."""
    mine = order[: count * share.size][share.rank :: share.size]
    return [len(dataset[i]["input_ids"]) for i in mine]


def _smallest_over_ranks(ratio: float) -> float:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        value = torch.tensor([ratio], dtype=torch.float64)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN)
        return float(value.item())
    return ratio


def build_finetuning_dataloader(settings: FinetuningLoaderSettings, tokenizer, device_batch_size: int, *,
                                key: str = "train_loader", share: dist.DataShare | None = None):
    """Batches of the validated ``settings`` (see FinetuningDatasetSettings.check_settings for what is checked);
    ``share``: this rank's share of the examples (default: its own, by world rank).

    ``packing_ratio`` as llm-foundry reads it: ``int(device_batch_size * ratio)`` examples a batch, packed by its
    rule (data/packing.py); 1 (also what ``auto`` chooses for max_seq_len <= 100) means no packing at all.
    """
    ds = settings.dataset
    share = share or dist.data_share()
    if tokenizer is None or tokenizer.eos_token_id is None:
        raise ConfigError("tokenizer.name: the finetuning loader needs a tokenizer with an EOS token")
    pad = ds.pad_token_id
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ratio = ds.packing_ratio
    keep = ds.max_leftover_bins_to_keep
    if ds.is_mds:
        packs = ratio is not None and float(ratio) != 1.0
        per_batch = examples_per_batch(device_batch_size, float(ratio)) if packs else device_batch_size
        dataset = make_streaming_dataset(StreamingFinetuningDataset, ds, per_batch, f"{key}.dataset", share)
        collator = FinetuningCollator(ds, pad, device_batch_size, tokenizer.padding_side)
        collate = StreamPackingCollator(PackingState(collator, keep, 0, False)) if packs else collator
        if packs and keep != 0:
            notice_once(f"{key}.dataset.packing_ratio: with MDS data the packed rows carried over between batches are "
                        "not in checkpoints (nor in llm-foundry's): a resumed run continues without them")
        return streaming.StreamingDataLoader(dataset, batch_size=per_batch, collate_fn=collate,
                                             **dataloader_kwargs(settings))
    dataset = FinetuningDataset(tokenizer, ds, f"{key}.dataset")
    if ratio == "auto":
        order = epoch_order(len(dataset), ds.shuffle, ds.shuffle_seed, 0)
        sizes = _profiled_sizes(order, dataset, profiled_example_count(ds.max_seq_len, device_batch_size), share)
        ratio = _smallest_over_ranks(auto_packing_ratio(sizes, ds.max_seq_len, device_batch_size))
        print(f"{key}.dataset.packing_ratio: auto chose {ratio}", flush=True)
    packs = ratio is not None and float(ratio) != 1.0
    collator = FinetuningCollator(ds, pad, device_batch_size, tokenizer.padding_side)
    packing = PackingState(collator, keep, settings.num_workers, settings.persistent_workers) if packs else None
    per_batch = examples_per_batch(device_batch_size, float(ratio)) if packs else device_batch_size
    return FinetuningLoader(dataset, collator, per_batch, settings, share, packing=packing,
                            packing_ratio=float(ratio) if ratio is not None else None)
