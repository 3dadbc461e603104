"""The ``text`` loader: pretraining batches from MDS shards (local or s3://), deterministic and resumable.

YAML (llm-foundry's shape)::

    train_loader:
      name: text
      dataset:
        remote: s3://bucket/c4          # or streams: {c4: {remote: ..., proportion: 0.7}, code: {...}}
        local: /tmp/c4                  # optional with remote (a per-run cache folder is chosen)
        split: train
        shuffle: true
        shuffle_seed: 17
        max_seq_len: 2048
        eos_token_id: 0                 # -> sequence_id, so attention does not cross documents
      drop_last: true
      num_workers: 8

Samples come from a ``tokens`` column (what llmfoundry's converters write: fixed-length integer arrays; legacy
``bytes`` columns of int64 are read too) or a ``text`` column (tokenized on the fly, padded). A batch is a dict
of ``input_ids`` (B, T) long, ``labels`` (B, T) long (a copy of input_ids, -100 on padding; not shifted),
``sequence_id`` (B, T) when ``eos_token_id`` or ``bos_token_id`` is set, and ``attention_mask`` when a batch
holds padding. The loader's ``state_dict()`` is streaming's global sample position (epoch, sample_in_epoch,
num_canonical_nodes, shuffle_seed), so a run resumed on a different number of ranks neither repeats nor skips.
The loader's settings are in loader_settings.py.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np
import torch

from llmfoundry.core import dist, objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.scratch import user_temp_folder
from llmfoundry.data.loader_settings import StreamingOptions, TextLoaderSettings
from llmfoundry.data.shard_check import check_local_shards
from llmfoundry.data.shm_registration import shm_registration_lock
from llmfoundry.data.streaming_guard import import_streaming

IGNORE_INDEX = -100
streaming = import_streaming()  # through the guard: streaming must import without a working torchvision


# ----------------------------------------------------------------------------------------------- local folders
_used_locals: dict[str, int] = {}
_used_lock = threading.Lock()


def cache_root() -> str:
    """Where shards streamed from a remote are cached (``LLMFOUNDRY_CACHE``, default: this user's temp folder)."""
    return os.environ.get("LLMFOUNDRY_CACHE") or user_temp_folder("llmfoundry-mds-cache", "LLMFOUNDRY_CACHE")


def _run_key() -> str:
    """Same for every rank of one launch on a node, different between launches (so caches do not collide)."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) > 1:
        return f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}-{os.getppid()}"
    return f"pid{os.getpid()}"


def resolve_local(remote: str | None, local: str | None, split: str | None, key: str,
                  validate_hash: str | None = None) -> str | None:
    """The local folder for one stream.

    Without a remote the local folder is the data and must exist. With a remote, an unset local becomes a
    folder under ``cache_root()``; and because streaming refuses two live datasets that cache one remote into
    the same folder, a second dataset in this process that names the same local folder gets a sub-folder.
    """
    if remote is None:
        if local is None:
            raise ConfigError(f"{key}: set remote (s3://...) or local (a folder of MDS shards)")
        folder = os.path.join(local, split) if split else local
        if not os.path.isfile(os.path.join(folder, "index.json")):
            what = "does not exist" if not os.path.exists(folder) else "has no index.json (not an MDS dataset)"
            raise ConfigError(
                f"{key}.local: folder '{folder}' {what} (set {key}.remote or run data_prep/convert_text_to_mds.py "
                "or data_prep/convert_dataset_hf.py to create it)"
            )
        check_local_shards(folder, validate_hash, key)  # streaming checks only what it downloads
        return local
    with _used_lock:
        if local is None:
            digest = hashlib.sha1(f"{remote}|{split}".encode()).hexdigest()[:12]
            local = os.path.join(cache_root(), _run_key(), digest)
        count = _used_locals.get(local, 0)
        _used_locals[local] = count + 1
    return local if count == 0 else os.path.join(local, f"_copy{count}")


def build_streams(settings: StreamingOptions, key: str):
    """(streams or None, remote, local) for StreamingDataset from the settings."""
    if settings.streams:
        streams = []
        for name, stream in settings.streams.items():
            split = stream.split if stream.split is not None else settings.split
            local = resolve_local(stream.remote, stream.local, split, f"{key}.streams.{name}",
                                  stream.validate_hash or settings.validate_hash)
            streams.append(
                streaming.Stream(
                    remote=stream.remote,
                    local=local,
                    split=split,
                    proportion=stream.proportion,
                    repeat=stream.repeat,
                    choose=stream.choose,
                    download_retry=stream.download_retry,
                    download_timeout=stream.download_timeout,
                    validate_hash=stream.validate_hash,
                    keep_zip=stream.keep_zip,
                )
            )
        return streams, None, None
    local = resolve_local(settings.remote, settings.local, settings.split, key, settings.validate_hash)
    return None, settings.remote, local


def _replication(settings: StreamingOptions, group: int, key: str) -> int | None:
    """The recipe's ``replication``; under tensor parallelism the ``group`` ranks of one TP group (which compute
    one microbatch together) must receive the same samples."""
    if group == 1:
        return settings.replication
    if settings.replication not in (None, group):
        raise ConfigError(f"{key}.replication: {settings.replication}, but the {group} ranks of a tensor-parallel "
                          f"group must see the same samples (remove it or set {group})")
    return group


def streaming_kwargs(settings: StreamingOptions, batch_size: int, key: str, share: dist.DataShare) -> dict[str, Any]:
    streams, remote, local = build_streams(settings, key)
    return dict(
        streams=streams,
        remote=remote,
        local=local,
        split=settings.split if streams is None else None,
        download_retry=settings.download_retry,
        download_timeout=settings.download_timeout,
        validate_hash=settings.validate_hash,
        keep_zip=settings.keep_zip,
        epoch_size=settings.epoch_size,
        predownload=settings.predownload,
        cache_limit=settings.cache_limit,
        partition_algo=settings.partition_algo,
        num_canonical_nodes=settings.num_canonical_nodes,
        batch_size=batch_size,
        shuffle=settings.shuffle,
        shuffle_algo=settings.shuffle_algo,
        shuffle_seed=settings.shuffle_seed,
        shuffle_block_size=settings.shuffle_block_size,
        sampling_method=settings.sampling_method,
        sampling_granularity=settings.sampling_granularity,
        batching_method=settings.batching_method,
        replication=_replication(settings, share.replication, key),
        allow_unsafe_types=settings.allow_unsafe_types,
    )


def _sources(settings: StreamingOptions) -> str:
    """Where the MDS data of ``settings`` lives, for messages (remote or local, with the split)."""

    def where(remote, local, split):
        root = remote or local or "?"
        return f"{str(root).rstrip('/')}/{split}" if split else str(root)

    if settings.streams:
        parts = []
        for name, stream in settings.streams.items():
            split = stream.split if stream.split is not None else settings.split
            parts.append(f"{name}: {where(stream.remote, stream.local, split)}")
        return "; ".join(parts)
    return where(settings.remote, settings.local, settings.split)


def _is_missing_data(error: BaseException) -> bool:
    """Whether ``error`` (from streaming, botocore, a local read...) means "the object/file does not exist"."""
    text = str(error).lower()  # streaming words a missing local file in its own way
    return objectstore.is_missing(error) or "does not exist" in text or "no such file" in text


def make_streaming_dataset(cls, settings: StreamingOptions, batch_size: int, key: str, share: dist.DataShare | None,
                           **extra):
    """Instantiate a StreamingDataset subclass (``extra``: its own arguments), turning streaming's errors about
    missing or empty data into ConfigErrors (our own ConfigErrors pass through unchanged). Streaming deals the
    samples by world rank itself; ``share`` (default: every rank its own share) says which ranks see the same."""
    kwargs = streaming_kwargs(settings, batch_size, key, share or dist.data_share())
    try:
        with shm_registration_lock():
            return cls(**kwargs, **extra)
    except ConfigError:
        raise
    except Exception as error:
        text = " ".join(str(error).split())
        if "contains an unsafe type" in text:  # streaming refuses pickle columns unless allow_unsafe_types
            raise ConfigError(
                f"{key}.allow_unsafe_types: the MDS data at {_sources(settings)} has a pickle column ({text[:120]}); "
                "set allow_unsafe_types: true only if you trust whoever wrote it"
            ) from None
        if "contains no samples" in text:
            index = text.split("contains no samples:", 1)[-1].strip(" .") or _sources(settings)
            raise ConfigError(
                f"{key}: the MDS dataset {index} has no samples; convert data into it (with data_prep/ converters; "
                "a --concat_tokens longer than the data writes none) or point remote/local/split elsewhere"
            ) from None
        if _is_missing_data(error):
            raise ConfigError(
                f"{key}: no MDS dataset at {_sources(settings)} (index.json not found); check remote/local/split, or "
                f"create it with data_prep/convert_text_to_mds.py or data_prep/convert_dataset_hf.py ({text[:160]})"
            ) from None
        raise


# ----------------------------------------------------------------------------------------------- dataset and batches
class EndsAbandonedEpochs:
    """A StreamingDataset mixin: an iteration abandoned before the epoch's end (one batch taken, an eval round cut
    by ``eval_subset_num_batches``, a loader dropped) stops its epoch's prepare/ready threads.

    streaming stops them only after the last sample, or when the dataset is iterated again; until then they poll
    every few milliseconds, and a process that abandons many iterations (every eval round, a test suite) slows
    down with each. Only this iteration's own epoch is stopped: a newer one of the same dataset goes on. Every
    iteration, finished or abandoned, also shuts down the dataset's thread pool (its running work goes on)."""

    def __iter__(self):
        samples = super().__iter__()
        epoch = executor = None
        try:
            for sample in samples:
                if epoch is None:  # streaming makes the epoch's iterator and thread pool before its first sample
                    epoch = getattr(self, "_iterator", None)
                    executor = getattr(self, "_executor", None)
                yield sample
        finally:
            samples.close()
            if epoch is not None:
                epoch.non_blocking_exit()  # its threads end at their next tick; nothing here waits on a download
            if executor is not None and executor is getattr(self, "_executor", None):
                # streaming keeps one pool per dataset and process, whose idle workers would live as long as the
                # dataset (a trainer's loaders: the whole run). Shut it down; forgetting the process that made it
                # makes the next epoch start a fresh pool, as streaming does in a forked child.
                executor.shutdown(wait=False)
                self._thread_pid = None


class StreamingTextDataset(EndsAbandonedEpochs, streaming.StreamingDataset):
    """Turns an MDS sample into a 1-D long tensor of at most ``max_seq_len`` token ids."""

    def __init__(self, *, tokenizer, max_seq_len: int, token_encoding_type: str, **options):
        super().__init__(**options)
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.token_encoding_type = token_encoding_type

    def __getitem__(self, index: int) -> torch.Tensor:
        sample = super().__getitem__(index)
        if "tokens" in sample:
            tokens = sample["tokens"]
            if isinstance(tokens, (bytes, bytearray)):
                dtype = np.int64 if self.token_encoding_type == "auto" else np.dtype(self.token_encoding_type)
                tokens = np.frombuffer(tokens, dtype=dtype)
            tokens = np.asarray(tokens)[: self.max_seq_len]
        elif "text" in sample:
            if self.tokenizer is None:
                raise ConfigError("text loader: this MDS dataset stores raw `text`; a tokenizer is required")
            tokens = np.asarray(self.tokenizer(sample["text"], truncation=True, max_length=self.max_seq_len)["input_ids"])
        else:
            raise ConfigError(
                f"text loader: MDS samples have columns {sorted(sample)}; expected 'tokens' (from llmfoundry's "
                "converters) or 'text'"
            )
        return torch.from_numpy(tokens.astype(np.int64))


def sequence_ids(input_ids: torch.Tensor, eos_token_id: int | None, bos_token_id: int | None) -> torch.Tensor:
    """Per-token document index within each row: a new document starts after an EOS or at a BOS."""
    if eos_token_id is not None:
        is_end = (input_ids == eos_token_id).long()
        return torch.cumsum(is_end, dim=1) - is_end  # the EOS belongs to the document it ends
    assert bos_token_id is not None
    starts = torch.cumsum((input_ids == bos_token_id).long(), dim=1)
    return starts - starts[:, :1]


class TextCollator:
    """Stacks token tensors into a batch; pads short rows (labels -100 there)."""

    def __init__(self, max_seq_len: int, pad_token_id: int, eos_token_id: int | None, bos_token_id: int | None):
        self.max_seq_len = max_seq_len
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id

    def __call__(self, rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        length = max(len(r) for r in rows)
        padded = any(len(r) != length for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        labels = input_ids.clone()
        batch = {"input_ids": input_ids, "labels": labels}
        if padded:
            labels[mask == 0] = IGNORE_INDEX
            batch["attention_mask"] = mask
        if self.eos_token_id is not None or self.bos_token_id is not None:
            batch["sequence_id"] = sequence_ids(input_ids, self.eos_token_id, self.bos_token_id)
        return batch


def check_token_ids(batch: dict[str, torch.Tensor], vocab_size: int, *, key: str = "input_ids") -> None:
    """Raise a ConfigError when a batch holds a token id outside ``0 .. vocab_size - 1`` (tokenizer/model mismatch)."""
    ids = batch[key]
    if ids.numel() == 0:
        return
    largest, smallest = int(ids.max()), int(ids.min())
    if largest >= vocab_size or smallest < 0:
        bad = largest if largest >= vocab_size else smallest
        raise ConfigError(
            f"model.vocab_size: the data holds token id {bad} but the model's vocab_size is {vocab_size}; set "
            f"model.vocab_size >= {largest + 1} or convert the data with the model's tokenizer"
        )


class _CheckedCollator:
    def __init__(self, collator, vocab_size: int):
        self.collator, self.vocab_size = collator, vocab_size

    def __call__(self, rows):
        batch = self.collator(rows)
        check_token_ids(batch, self.vocab_size)
        return batch


def dataloader_kwargs(settings: Any) -> dict[str, Any]:
    """torch DataLoader keyword arguments of a validated loader section (see dataloader_problems)."""
    kwargs: dict[str, Any] = dict(
        num_workers=settings.num_workers, pin_memory=settings.pin_memory, drop_last=settings.drop_last, timeout=settings.timeout
    )
    if settings.num_workers > 0:
        kwargs["persistent_workers"] = settings.persistent_workers
        kwargs["prefetch_factor"] = settings.prefetch_factor or 2
    return kwargs


def build_text_dataloader(settings: TextLoaderSettings, tokenizer, device_batch_size: int, *, key: str = "train_loader",
                          share: dist.DataShare | None = None):
    """A StreamingDataLoader of pretraining batches (see the module docstring) from validated ``settings`` (see the
    sections' ``check_settings``); ``share``: this rank's share of the data (default: its own, by world rank)."""
    ds = settings.dataset
    if device_batch_size <= 0:
        raise ConfigError(f"{key}: device batch size must be positive, got {device_batch_size}")
    dataset = make_streaming_dataset(StreamingTextDataset, ds, device_batch_size, f"{key}.dataset", share,
                                     tokenizer=tokenizer, max_seq_len=ds.max_seq_len,
                                     token_encoding_type=ds.token_encoding_type)
    if len(dataset) == 0:
        raise ConfigError(f"{key}.dataset: the MDS dataset has no samples for this rank; convert more data")
    pad = ds.pad_token_id
    if pad is None and tokenizer is not None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator: Any = TextCollator(ds.max_seq_len, pad if pad is not None else 0, ds.eos_token_id, ds.bos_token_id)
    if ds.vocab_size is not None:
        collator = _CheckedCollator(collator, ds.vocab_size)
    return streaming.StreamingDataLoader(
        dataset, batch_size=device_batch_size, collate_fn=collator, **dataloader_kwargs(settings)
    )
