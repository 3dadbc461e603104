"""What every converter shares: the token dtype, tokenizing in parallel, concatenated MDS.

A pretraining MDS dataset holds one column, ``tokens``: fixed-length arrays of ``concat_tokens`` token ids in the
smallest unsigned integer dtype that holds every id of the tokenizer (``uint16`` for vocabularies up to 65,536).
Documents are tokenized, each wrapped as ``bos_text + document + eos_text``, concatenated, and cut into samples;
a sample may hold the end of one document and the start of the next. ``--no_wrap`` (llm-foundry's semantics): when
a document fills a sample, that sample is written and the rest of the document is dropped, so a document never
continues into the next sample (a long document yields one sample). Tokens left over at the end (fewer than one
sample) are dropped.
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep import timing
from llmfoundry.data.sources import mp_context
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.streaming_stores import WRITTEN_STORES, route_store_uploads

streaming = import_streaming()  # through the guard: streaming must import without a working torchvision
route_store_uploads(streaming)  # MDSWriter's uploads to gs://, Azure and oci:// go through our clients

# Where the converters write: a local folder or any store (s3:// with streaming's own uploader, the others with ours)
OUTPUT_STORES = (objectstore.S3, *WRITTEN_STORES)

TOKENS_COLUMN = "tokens"
# Checksums written into index.json for each shard: a training recipe's validate_hash (streaming's key) checks the
# shards against them (data/shard_check.py for local folders); both are cheap next to tokenizing.
SHARD_HASHES = ["sha1", "xxh64"]


def mds_writer(columns: dict[str, str], out, compression: str | None, **kwargs):
    """streaming's MDSWriter as every converter uses it: shard checksums, an existing output folder reused."""
    return streaming.MDSWriter(columns=columns, out=out, compression=compression or None, exist_ok=True,
                               hashes=SHARD_HASHES, **kwargs)


# ----------------------------------------------------------------------------------------------- tokens
def vocab_size_of(tokenizer) -> int:
    """One more than the largest id the tokenizer can produce (added tokens included)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)


def tokens_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds the ids 0 .. vocab_size - 1."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def require_eos(tokenizer, flag: str = "--tokenizer") -> None:
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{flag}: the tokenizer has no EOS token; pass --tokenizer_kwargs '{{\"eos_token\": \"...\"}}'")


@dataclass
class ConcatSpec:
    """How documents become fixed-length token samples."""

    concat_tokens: int
    bos_text: str = ""
    eos_text: str = ""
    no_wrap: bool = False


def _text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _plain_fast_backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` when calling it directly gives the ids that
    ``tokenizer(docs, add_special_tokens=False)`` gives, else None (then the tokenizer's own call runs).

    A Hugging Face fast tokenizer whose class overrides neither ``__call__`` nor ``_encode_plus`` (and has no
    input/target modes) hands a batch to its backend's ``encode_batch`` with truncation and padding off and its
    ``split_special_tokens``; the backend is set up the same way here. ``encode_batch_fast`` returns the same ids
    without computing character offsets, which the converters never read (benchmarks/results/data_prep_profile.md).
    """
    cls = type(tokenizer)
    if (not isinstance(tokenizer, PreTrainedTokenizerFast) or cls.__call__ is not PreTrainedTokenizerBase.__call__
            or cls._encode_plus is not PreTrainedTokenizerFast._encode_plus or hasattr(tokenizer, "_switch_to_input_mode")):
        return None
    backend = tokenizer.backend_tokenizer
    if not hasattr(backend, "encode_batch_fast"):
        return None
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    backend.encode_special_tokens = bool(tokenizer.split_special_tokens)
    return backend


class _Encoder:
    """Tokenizes a batch of documents into one flat array plus per-document lengths (picklable for workers)."""

    def __init__(self, tokenizer, spec: ConcatSpec):
        self.tokenizer = tokenizer
        self.bos = _text_ids(tokenizer, spec.bos_text)
        self.eos = _text_ids(tokenizer, spec.eos_text)

    def encode(self, docs: list[str]) -> list[list[int]]:
        """Token ids of each document, exactly as ``tokenizer(docs, add_special_tokens=False)["input_ids"]``."""
        if not docs:
            return []
        backend = _plain_fast_backend(self.tokenizer)  # checked per batch: cheap, and survives pickling as is
        if backend is None:
            return self.tokenizer(docs, add_special_tokens=False)["input_ids"]
        return [encoding.ids for encoding in backend.encode_batch_fast(docs, add_special_tokens=False)]

    def __call__(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = self.encode(docs)
        bos, eos = self.bos, self.eos
        lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        lengths += len(bos) + len(eos)
        if bos or eos:  # one pass over the ids: cheaper than an array per document
            pieces = itertools.chain.from_iterable(itertools.chain(bos, ids, eos) for ids in encoded)
        else:
            pieces = itertools.chain.from_iterable(encoded)
        flat = np.fromiter(pieces, dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths


_worker_encoder: _Encoder | None = None


def _init_worker(encoder: _Encoder) -> None:
    global _worker_encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _worker_encoder = encoder


def _encode_in_worker(docs: list[str]) -> tuple[np.ndarray, np.ndarray, float]:
    assert _worker_encoder is not None
    start = time.perf_counter()
    flat, lengths = _worker_encoder(docs)
    return flat, lengths, time.perf_counter() - start


def start_pool(processes: int, **kwargs):
    """A process pool whose forked workers leave the parent's objects alone: without ``gc.freeze`` a worker's first
    full garbage collection touches every object it inherited, copying the parent's memory page by page (seconds
    of CPU when the parent holds a large corpus or tokenized data)."""
    gc.freeze()
    try:
        return mp_context().Pool(processes, **kwargs)
    finally:
        gc.unfreeze()


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_batches(
    docs: Iterable[str], tokenizer, spec: ConcatSpec, *, processes: int = 1, docs_per_batch: int = 256,
    phases: timing.Phases | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(flat token ids, per-document lengths) for consecutive batches of ``docs``, in order.

    ``phases`` (optional) gets the seconds spent reading ``docs`` and tokenizing (summed over the workers), and
    with workers the time to start them and the time this process waited for them. With workers, ``docs`` is read
    by the pool's feeder thread while this process waits for results."""
    phases = phases or timing.Phases()
    encoder = _Encoder(tokenizer, spec)
    reading = "read input (feeder thread)" if processes > 1 else "read input"
    batches = phases.iterate(reading, batched(docs, docs_per_batch))  # timed per batch, not per document
    if processes <= 1:
        for batch in batches:
            with phases.timed("tokenize"):
                encoded = encoder(batch)
            yield encoded
        return
    with phases.timed("start worker processes"):
        pool = start_pool(processes, initializer=_init_worker, initargs=(encoder,))
    with pool:
        results = pool.imap(_encode_in_worker, batches, chunksize=1)
        while True:
            with phases.timed("wait for workers"):
                result = next(results, None)
            if result is None:
                return
            flat, lengths, seconds = result
            phases.add("tokenize (in workers)", seconds)
            yield flat, lengths


class ConcatWriter:
    """Cuts a stream of tokenized documents into ``concat_tokens``-long samples and writes them as MDS."""

    def __init__(self, out: str, spec: ConcatSpec, vocab_size: int, compression: str | None = None, **writer_kwargs):
        if spec.concat_tokens <= 0:
            raise ConfigError(f"--concat_tokens: expected a positive sample length, got {spec.concat_tokens}")
        self.spec = spec
        self.dtype = tokens_dtype(vocab_size)
        self.vocab_size = vocab_size
        columns = {TOKENS_COLUMN: f"ndarray:{self.dtype.name}:{spec.concat_tokens}"}
        self.writer = mds_writer(columns, out, compression, **writer_kwargs)
        self.carry = np.empty(0, dtype=np.int64)
        self.samples = 0
        self.tokens_in = 0
        self.documents = 0

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.tokens_in += int(flat.size)
        self.documents += int(lengths.size)
        if flat.size and int(flat.max()) >= self.vocab_size:
            raise ConfigError(f"token id {int(flat.max())} >= vocabulary size {self.vocab_size} (tokenizer mismatch)")
        length = self.spec.concat_tokens
        if not self.spec.no_wrap:
            buffer = np.concatenate([self.carry, flat]) if self.carry.size else flat
            whole = buffer.size // length
            for row in buffer[: whole * length].reshape(whole, length):
                self._write(row)
            self.carry = buffer[whole * length :].copy()
            return
        # no_wrap (llm-foundry's ConcatTokensDataset): once a document fills a sample, that one sample is written
        # and the rest of the document is dropped; a document never continues into the next sample. Shorter
        # documents still share a sample: they are carried until one fills it.
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for start, end in zip(offsets[:-1], offsets[1:]):
            buffer = np.concatenate([self.carry, flat[start:end]])
            if buffer.size >= length:
                self._write(buffer[:length])
                self.carry = np.empty(0, dtype=np.int64)
            else:
                self.carry = buffer

    def _write(self, row: np.ndarray) -> None:
        self.writer.write({TOKENS_COLUMN: row.astype(self.dtype)})
        self.samples += 1

    def finish(self) -> None:
        self.writer.finish()


class Progress:
    """A progress bar on stderr (tqdm) that counts documents (or files, examples) and shows postfix values."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "doc", disable: bool | None = None):
        self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr, disable=disable)

    def update(self, n: int, **postfix) -> None:
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        self.bar.close()


def write_concatenated(
    docs: Iterable[str],
    tokenizer,
    out: str,
    spec: ConcatSpec,
    *,
    compression: str | None = None,
    processes: int = 1,
    desc: str = "tokenizing",
    total: int | None = None,
    show_progress: bool | None = None,
    phases: timing.Phases | None = None,
) -> dict[str, int]:
    """Tokenize ``docs`` (in ``processes`` worker processes), concatenate, write MDS to ``out`` (local or a store).

    ``phases`` (optional) gets the time spent reading ``docs``, tokenizing, writing samples and flushing shards."""
    require_eos(tokenizer)
    phases = phases or timing.Phases()
    writer = ConcatWriter(out, spec, vocab_size_of(tokenizer), compression)
    bar = Progress(desc, total=total, disable=None if show_progress is None else not show_progress)
    try:
        for flat, lengths in encode_batches(docs, tokenizer, spec, processes=processes, phases=phases):
            with phases.timed("concatenate + write samples"):
                writer.add(flat, lengths)
            bar.update(int(lengths.size), samples=writer.samples)
    finally:
        bar.close()
    with phases.timed("flush shards (zstd, hashes, files, index)"):
        writer.finish()
    return {"documents": writer.documents, "tokens": writer.tokens_in, "samples": writer.samples}


def write_texts(
    docs: Iterable[str],
    out: str,
    *,
    compression: str | None = None,
    desc: str = "writing",
    total: int | None = None,
    show_progress: bool | None = None,
) -> dict[str, int]:
    """Write ``docs`` untokenized, one per sample, as MDS with a ``text`` column (local or a store)."""
    writer = mds_writer({"text": "str"}, out, compression)
    bar = Progress(desc, total=total, disable=None if show_progress is None else not show_progress)
    documents = 0
    try:
        for doc in docs:
            writer.write({"text": doc})
            documents += 1
            bar.update(1)
    finally:
        bar.close()
    writer.finish()
    return {"documents": documents}


def parse_json_kwargs(text: str | None, flag: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{flag}: not valid JSON ({error.msg} at column {error.colno}): {text}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object like '{{\"model_max_length\": 2048}}', got {text}")
    return value


LOGGING_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_logging_argument(parser) -> None:
    parser.add_argument("--logging-level", "--logging_level", dest="logging_level", default=None,
                        type=str.upper, choices=LOGGING_LEVELS,
                        help="log llmfoundry's messages at this level and above on stderr (default: no log output)")


def set_logging_level(level: str | None) -> None:
    """Log llmfoundry's messages at ``level`` and above to stderr (``--logging-level``); None leaves logging alone."""
    if level is None:
        return
    logger = logging.getLogger("llmfoundry")
    logger.setLevel(level)
    if not any(getattr(h, "_llmfoundry_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._llmfoundry_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def tokenizer_kwargs_from_args(args) -> dict[str, Any]:
    """``--tokenizer_kwargs`` (a JSON object), plus ``trust_remote_code`` when ``--trust-remote-code`` is given."""
    kwargs = parse_json_kwargs(args.tokenizer_kwargs, "--tokenizer_kwargs")
    if getattr(args, "trust_remote_code", False):
        kwargs["trust_remote_code"] = True
    return kwargs


def default_processes() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def merge_group_indexes(output: str, parts: list[str]) -> int:
    """Write ``output/index.json`` listing the shards of every part folder; returns the number of samples."""
    shards = []
    for part in parts:
        raw = objectstore.read_bytes(objectstore.join(output, part, "index.json"), OUTPUT_STORES)
        if raw is None:
            raise ConfigError(f"{output}/{part}: index.json is missing; rerun with --reprocess")
        for shard in json.loads(raw)["shards"]:
            for key in ("raw_data", "zip_data"):
                if shard.get(key):
                    shard[key]["basename"] = f"{part}/{shard[key]['basename']}"
            shards.append(shard)
    index = json.dumps({"version": 2, "shards": shards}).encode()
    objectstore.write_bytes(objectstore.join(output, "index.json"), index, OUTPUT_STORES)
    return sum(s["samples"] for s in shards)


def check_output(out: str, flag: str) -> None:
    """Before any tokenizing: a one-line ConfigError naming ``flag`` unless ``out`` is a local folder or a folder
    of a store the converters write to that answers (no such bucket, access refused, no endpoint, unset
    credentials are said now, not after the first shard)."""
    if not objectstore.is_remote(out):
        return
    folder = objectstore.ObjectFolder(out, flag, max_attempts=3, stores=OUTPUT_STORES)
    try:
        folder.probe()
    except Exception as error:  # noqa: BLE001 - botocore's, gcsfs' and adlfs' errors
        raise objectstore.explain(error, out, flag) from None


def check_output_empty(out: str) -> None:
    """Refuse to mix a new conversion into an existing MDS folder."""
    if objectstore.read_bytes(objectstore.join(out, "index.json"), OUTPUT_STORES) is not None:
        raise ConfigError(f"{out}: already holds an MDS dataset (index.json); choose another output or delete it")
