"""The ``train_loader`` / ``eval_loader`` sections of the ``text`` (data/text.py) and ``finetuning``
(data/finetuning.py, data/finetuning_loader.py) loaders, and the checks on them: kept apart from the loaders so
that checking a recipe imports neither torch nor streaming (data/catalog.py pairs each name with its settings).
The loaders' modules describe the YAML.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from llmfoundry.config.checks import PositiveInt
from llmfoundry.config.fields import option
from llmfoundry.config.validate import Check
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.preprocessors import column_mapping_problems


# ----------------------------------------------------------------------------------------------- text
@dataclass
class StreamSettings:
    """One MDS source among several (``dataset.streams.<name>``)."""

    remote: str | None = option(None, "where the shards live: s3://bucket/path (endpoint from S3_ENDPOINT_URL), "
                                             "gs://bucket/path, azure://container/path, oci://bucket/path, "
                                             "hf://datasets/ORG/NAME/path or a folder")
    local: str | None = option(None, "local folder for the shards (the data itself when remote is unset; a cache otherwise)")
    split: str | None = option(None, "sub-folder of remote/local to read (e.g. train, val)")
    proportion: float | None = option(None, "share of each epoch drawn from this stream (others derived)")
    repeat: float | None = option(None, "times each sample of this stream is seen per epoch (e.g. 0.5, 2)")
    choose: int | None = option(None, "number of samples drawn from this stream per epoch")
    download_retry: int | None = option(None, "download attempts per shard (default: the dataset's)")
    download_timeout: float | None = option(None, "seconds before a shard download fails (default: the dataset's)")
    validate_hash: str | None = option(None, "hash algorithm to verify shards with (e.g. sha1)")
    keep_zip: bool | None = option(None, "keep compressed shards after decompressing them")


@dataclass
class StreamingOptions:
    """streaming's StreamingDataset options (shared by the text and finetuning loaders)."""

    remote: str | None = option(None, "where the shards live: s3://bucket/path (endpoint from S3_ENDPOINT_URL), "
                                             "gs://bucket/path, azure://container/path, oci://bucket/path, "
                                             "hf://datasets/ORG/NAME/path or a folder")
    local: str | None = option(None, "local folder with the shards (the data itself when remote is unset; a cache otherwise)")
    split: str | None = option(None, "sub-folder of remote/local to read (e.g. train, val)")
    streams: dict[str, StreamSettings] | None = option(None, "several sources mixed into one epoch, by name")
    shuffle: bool = option(False, "shuffle samples (deterministically, from shuffle_seed)")
    shuffle_seed: int = option(9176, "seed of the shuffle; the same seed gives the same order on any number of ranks")
    shuffle_algo: Literal["py1e", "py1br", "py1b", "py1s", "py2s", "naive"] = option("py1e", "streaming's shuffle algorithm")
    shuffle_block_size: int | None = option(None, "samples per shuffle block (default: streaming's)")
    num_canonical_nodes: int | None = option(None, "canonical nodes of the sample partition (keep it fixed across resumes)")
    partition_algo: str = option("relaxed", "streaming's partition algorithm")
    sampling_method: Literal["balanced", "fixed"] = option("balanced", "how stream proportions are sampled per epoch")
    sampling_granularity: int = option(1, "samples drawn from a shard at a time when sampling streams")
    batching_method: Literal["random", "stratified", "per_stream", "device_per_stream"] = option(
        "random", "how samples of several streams form batches"
    )
    epoch_size: int | None = option(None, "samples per epoch (default: every sample of every stream once)")
    predownload: int | None = option(None, "samples to download ahead per worker")
    cache_limit: str | None = option(None, "bytes of shards to keep locally (e.g. 10gb); older ones are evicted")
    download_retry: int = option(2, "download attempts per shard")
    download_timeout: float = option(60, "seconds before a shard download fails")
    validate_hash: str | None = option(None, "hash algorithm to verify shards with (e.g. sha1)")
    keep_zip: bool = option(False, "keep compressed shards after decompressing them")
    replication: int | None = option(None, "ranks that see the same samples (sequence parallelism)")
    allow_unsafe_types: bool = option(
        False, "read shards with pickle (pkl) columns, which can run code when loaded; false refuses them"
    )

    def check_settings(self, path: str) -> list[str]:
        if self.streams and (self.remote is not None or self.local is not None):
            return [f"{path}: set either streams or remote/local, not both"]
        # A URL of a store we cannot read (dbfs:, wasb://) is an error, never a local folder.
        remotes = [(f"{path}.remote", self.remote)]
        remotes += [(f"{path}.streams.{name}.remote", s.remote) for name, s in (self.streams or {}).items()]
        return [problem for key, url in remotes for problem in url_problems(url, key)]


def url_problems(url: str | None, key: str) -> list[str]:
    """The one-line error for an object-store URL we cannot read data from under ``key`` (none for s3://, gs://,
    Azure, oci://, hf:// or a path)."""
    if not objectstore.is_remote(url):
        return []
    try:
        objectstore.check_url(url, key, objectstore.SOURCES)
    except ConfigError as error:
        return [str(error)]
    return []


@dataclass
class TextDatasetSettings(StreamingOptions):
    """``train_loader.dataset`` for ``name: text``."""

    max_seq_len: PositiveInt = option(2048, "tokens per sample: longer samples are truncated, shorter ones padded")
    eos_token_id: int | None = option(None, "documents end with this token: sequence_id restarts after it")
    bos_token_id: int | None = option(None, "documents start with this token: sequence_id restarts at it")
    pad_token_id: int | None = option(None, "id used to pad short samples (default: the tokenizer's pad, else EOS)")
    token_encoding_type: Literal["auto", "int64", "int32", "uint16"] = option(
        "auto", "dtype of a legacy `bytes` column (auto: int64)"
    )
    vocab_size: int | None = option(None, "if set, a token id >= vocab_size in any batch is an error")

    def check_settings(self, path: str) -> list[str]:
        problems = super().check_settings(path)
        if self.eos_token_id is not None and self.bos_token_id is not None:
            problems.append(f"{path}: set eos_token_id or bos_token_id, not both")
        return problems


def _not_negative(value: int) -> None:
    if value < 0:
        raise ValueError(f"expected >= 0, got {value}")


WorkerCount = Annotated[int, Check(_not_negative)]


def dataloader_problems(settings: Any, path: str) -> list[str]:
    """What is wrong with the torch DataLoader options of a loader section (its ``check_settings``)."""
    if settings.num_workers > 0:
        return []
    needs_workers = {"prefetch_factor": settings.prefetch_factor is not None,
                     "persistent_workers": settings.persistent_workers}
    return [f"{path}.{name}: needs num_workers > 0 (it is 0)" for name, is_set in needs_workers.items() if is_set]


@dataclass
class TextLoaderSettings:
    """``train_loader`` / ``eval_loader`` with ``name: text``."""

    dataset: TextDatasetSettings = option(default_factory=TextDatasetSettings, doc="the MDS data and how to read it")
    drop_last: bool = option(True, "drop the last incomplete batch of an epoch")
    num_workers: WorkerCount = option(0, "DataLoader worker processes")
    prefetch_factor: int | None = option(None, "batches each worker loads ahead (needs num_workers > 0; default 2)")
    pin_memory: bool = option(False, "pin batches in page-locked memory (faster host-to-GPU copies)")
    persistent_workers: bool = option(False, "keep workers alive between epochs (needs num_workers > 0)")
    timeout: float = option(0, "seconds to wait for a batch from a worker (0: forever)")

    def check_settings(self, path: str) -> list[str]:
        return dataloader_problems(self, path)


# ----------------------------------------------------------------------------------------------- finetuning
@dataclass
class FinetuningDatasetSettings(StreamingOptions):
    """``train_loader.dataset`` for ``name: finetuning``."""

    shuffle_seed: int | None = option(
        None, "seed of the shuffle (none = llm-foundry's defaults: 9176 for MDS shards, streaming's own; 0 for "
        "hf_name records, its sampler's)"
    )
    hf_name: str | None = option(None, "a hub id, a local dataset folder, 'json' (with hf_kwargs.data_files), or s3://folder")
    hf_kwargs: dict[str, Any] = option(default_factory=dict, doc="passed to datasets.load_dataset (e.g. data_files)")
    preprocessing_fn: str | dict[str, str] | None = option(
        None, "how raw records become examples: a registered name (unset: the one registered for hf_name, e.g. "
        "tatsu-lab/alpaca), module:function, or a column mapping {prompt: COLUMN, response: COLUMN}"
    )
    safe_load: bool | None = option(
        None, "read only .csv/.json/.jsonl/.parquet files (a hub dataset is downloaded with only those); no loading "
        "scripts, pickle or arrow files",
        differs="with hf_name json/csv/parquet (data_files, data_dir) or a local .jsonl file, the files' types are "
        "checked and read (llm-foundry tries to download such a name from the hub and fails)",
    )
    eos_token_id: int | None = option(
        None, "accepted from llm-foundry recipes and unused, as there: responses end with the tokenizer's EOS (a "
        "different id prints a notice)"
    )
    mapping: dict[str, Any] | None = option(
        None, "not an llm-foundry finetuning key (it ignores it): map columns with preprocessing_fn: "
        "{prompt: COLUMN, response: COLUMN}",
        differs="an error here; llm-foundry warns that it is an extraneous key and ignores it",
    )
    max_seq_len: PositiveInt = option(2048, "tokens per row; longer examples are truncated")
    decoder_only_format: bool = option(
        True, "prompt and response in one sequence; false: encoder-decoder batches for model.name hf_t5 (context -> "
        "input_ids, the last response -> labels and the decoder's inputs; no packing)"
    )
    target_prompts: str = option("none", "which prompt tokens carry loss: none, all, or length>=N")
    target_responses: Literal["last", "all"] = option("last", "which responses carry loss: the last turn's or all")
    packing_ratio: float | Literal["auto"] | None = option(
        None, "examples per row when packing (a number >= 1), auto (largest ratio with no waste), or null (no packing)"
    )
    # --- packing keys (owned by data/finetuning_loader.py and data/packing.py, which read them) ---
    max_leftover_bins_to_keep: int | None = option(
        None, "with packing: how many packed rows that did not fit a batch carry over into the next (fullest "
        "first; null: all, 0: none, the rest are never trained)"
    )
    auto_packing_replication: int | None = option(
        None, "accepted from llm-foundry, without effect (it sets this key itself while profiling packing_ratio: auto)"
    )
    # --- end of packing keys ---
    allow_pad_trimming: bool = option(False, "pad a batch only to its longest row instead of max_seq_len")
    pad_token_id: int | None = option(None, "id used for padding (default: the tokenizer's pad, else EOS)")

    def __post_init__(self) -> None:
        if self.shuffle_seed is None:  # llm-foundry: StreamingFinetuningDataset's 9176, DistributedSampler's 0
            self.shuffle_seed = 9176 if self.is_mds else 0

    @property
    def is_mds(self) -> bool:
        """Whether the examples are MDS shards (remote/local/streams) rather than records to tokenize."""
        return self.remote is not None or self.local is not None or bool(self.streams)

    def check_settings(self, path: str) -> list[str]:
        problems = super().check_settings(path)
        if self.is_mds and self.hf_name:
            problems.append(f"{path}: set hf_name or remote/local/streams, not both")
        elif self.is_mds:  # llm-foundry refuses these with MDS data too (eos_token_id: streaming's TypeError)
            stray = {"hf_kwargs": bool(self.hf_kwargs), "preprocessing_fn": self.preprocessing_fn is not None,
                     "safe_load": self.safe_load is not None, "eos_token_id": self.eos_token_id is not None}
            problems += [f"{path}.{name}: applies to hf_name records, not MDS data (remote/local/streams); remove it"
                         for name, is_set in stray.items() if is_set]
        if isinstance(self.preprocessing_fn, dict):
            problems += column_mapping_problems(self.preprocessing_fn, f"{path}.preprocessing_fn")
        if self.mapping is not None:
            problems.append(f"{path}.mapping: not a key of llm-foundry's finetuning dataset (it would ignore it); "
                            f"write the column mapping as preprocessing_fn: {{prompt: COLUMN, response: COLUMN}}")
        try:
            prompt_target_length(self.target_prompts, path)
        except ConfigError as error:
            problems.append(str(error))
        ratio = self.packing_ratio
        if ratio is not None and not self.decoder_only_format:
            problems.append(f"{path}.packing_ratio: packing needs decoder_only_format: true")
        elif ratio == "auto" and self.is_mds:
            problems.append(f"{path}.packing_ratio: 'auto' needs hf_name data; set a number for MDS data")
        elif ratio not in (None, "auto") and ratio < 1:
            problems.append(f"{path}.packing_ratio: expected >= 1 (examples per row), got {ratio}")
        if self.max_leftover_bins_to_keep is not None and (ratio is None or self.max_leftover_bins_to_keep < 0):
            problems.append(f"{path}.max_leftover_bins_to_keep: needs packing_ratio set and a value >= 0 (got "
                            f"{self.max_leftover_bins_to_keep}, packing_ratio {ratio}); set both or remove it")
        if not self.decoder_only_format and (self.target_prompts != "none" or self.target_responses != "last"):
            problems.append(f"{path}.decoder_only_format: false makes the last response the labels; leave "
                            "target_prompts none and target_responses last")
        return problems


@dataclass
class FinetuningLoaderSettings:
    """``train_loader`` / ``eval_loader`` with ``name: finetuning``."""

    dataset: FinetuningDatasetSettings = option(default_factory=FinetuningDatasetSettings, doc="the examples")
    drop_last: bool = option(True, "drop the last incomplete batch of an epoch")
    num_workers: WorkerCount = option(0, "DataLoader worker processes")
    prefetch_factor: int | None = option(None, "batches each worker loads ahead (needs num_workers > 0)")
    pin_memory: bool = option(False, "pin batches in page-locked memory")
    persistent_workers: bool = option(False, "keep workers alive between epochs (needs num_workers > 0)")
    timeout: float = option(0, "seconds to wait for a batch from a worker (0: forever)")

    def check_settings(self, path: str) -> list[str]:
        return dataloader_problems(self, path)


def prompt_target_length(rule: str, key: str) -> float:
    """The shortest prompt, in tokens, that carries loss under the ``target_prompts`` rule (inf for none)."""
    if rule == "none":
        return math.inf
    if rule == "all":
        return 0
    match = re.fullmatch(r"length>=(\d+)", rule.replace(" ", ""))
    if not match:
        raise ConfigError(f"{key}.target_prompts: expected none, all or length>=N, got '{rule}'")
    return int(match.group(1))
