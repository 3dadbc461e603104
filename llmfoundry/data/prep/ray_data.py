"""``--ray``: the converters' tokenizing and writing as Ray Data ``map_batches`` over a cluster's CPUs.

The output holds the same samples as the single-machine converter's, in the same order, written by the same code
(``common.ConcatWriter`` / ``common.mds_writer``, local or in a store), with one ``index.json`` at the root that lists
every block's shards (``block-00000/shard.00000.mds.zstd``, ...).

How the order is kept. The documents (or files, or finetuning records) are cut into *blocks* of consecutive items,
numbered in input order; a block never spans two *streams* (a stream is what the single-machine converter
concatenates in one go: the whole input for ``convert_dataset_json/hf``, one group of files for
``convert_text_to_mds``). Ray may run the blocks in any order: every row carries its block number, and the merged
index lists the blocks' folders by number, so the order of the output never depends on Ray's scheduling.

Concatenated samples cross block boundaries, so tokenized data is written in two passes:

1. *tokenize* (``map_batches``, materialized in Ray's object store): each block's token ids, its documents'
   lengths and its last ``concat_tokens - 1`` ids (its *tail*);
2. on the driver, a scan over the blocks' sizes (not their tokens) finds the *carry* of each block: the tokens the
   single-machine writer would be holding, unwritten, when that block's first document arrives. The carry is always
   a suffix of the stream so far, shorter than one sample (with wrapping its length is ``tokens before the block
   mod concat_tokens``; with ``--no_wrap`` it is found by replaying the documents' lengths), so it is cut from the
   tails of the blocks before it;
3. *write* (``map_batches``): each block starts a ``ConcatWriter`` holding its carry and feeds it the block's
   documents. It writes exactly the samples that the single-machine writer completes while reading that block
   (a sample that straddles a boundary is written by the block where it ends); what it holds at the end is the next
   block's carry, and the stream's last leftover is dropped, as on a single machine.

Finetuning examples are independent of each other: one pass tokenizes and writes each block.

Workers get the tokenizer, the blocks and the plan through Ray's object store (one reference each, cached per
worker process). The object-store endpoints (``S3_ENDPOINT_URL`` and the region; OCI's endpoint, namespace and
region; the GCS emulator; the Azure account name) are handed to the workers; the credentials are the cluster's own
(each node's usual AWS chain, google-auth's, azure-identity's or its AZURE_STORAGE_* / OCI_S3_* variables).
llmfoundry must be installed on every node.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.data import finetuning
from llmfoundry.data.prep import common
from llmfoundry.data.prep.common import ConcatSpec

log = logging.getLogger(__name__)

INSTALL = "pip install 'llmfoundry[ray]'"
# What the workers need to reach the same object store as the driver (never credentials: those are the nodes' own).
ENDPOINT_VARIABLES = ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                      "OCI_S3_ENDPOINT_URL", "OCI_NAMESPACE", "OCI_REGION", "STORAGE_EMULATOR_HOST",
                      "AZURE_STORAGE_ACCOUNT_NAME")
BLOCKS_PER_WORKER = 4  # enough blocks to keep every worker busy while the slowest finishes
MAX_ITEMS_PER_BLOCK = 4096


# ----------------------------------------------------------------------------------------------- flags and session
def add_arguments(parser) -> None:
    parser.add_argument("--ray", action="store_true",
                        help="tokenize and write with Ray Data on a Ray cluster (the same samples, in the same order)")
    parser.add_argument("--ray-address", "--ray_address", dest="ray_address", default=None,
                        help="Ray cluster to use with --ray (default: RAY_ADDRESS, a cluster started on this machine "
                             "with `ray start`, or a new local one)")
    parser.add_argument("--ray-workers", "--ray_workers", dest="ray_workers", type=int, default=None,
                        help="Ray Data workers (one CPU each) with --ray (default: every CPU of the cluster)")


def check_flags(args, local_only: dict[str, Any] | None = None) -> None:
    """One-line errors for flag combinations that cannot work; ``local_only`` names flags that --ray replaces."""
    if not args.ray:
        for flag, value in (("--ray-address", args.ray_address), ("--ray-workers", args.ray_workers)):
            if value is not None:
                raise ConfigError(f"{flag}: only used with --ray; add --ray or drop {flag}")
        return
    if args.ray_workers is not None and args.ray_workers < 1:
        raise ConfigError(f"--ray-workers: expected >= 1, got {args.ray_workers}")
    for flag, value in (local_only or {}).items():
        if value not in (None, False):
            raise ConfigError(f"{flag}: not with --ray (Ray's workers do this work; use --ray-workers to size them)")


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401 - the [data] extra
    except ImportError:
        raise ConfigError(f"--ray: Ray Data is not installed ({INSTALL})") from None
    return ray


@contextmanager
def session(args) -> Iterator[int | None]:
    """With --ray: connects to (or starts) a Ray cluster for one conversion and yields the number of workers to use;
    without: yields None."""
    if not args.ray:
        yield None
        return
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=args.ray_address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise ConfigError(f"--ray-address: cannot connect to Ray at '{args.ray_address or 'auto'}' "
                              f"({first_line(error)})") from None
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = not getattr(args, "quiet", False)
    try:
        yield args.ray_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if started:
            ray.shutdown()


def _config_error_in(error: BaseException) -> ConfigError | None:
    """The ConfigError a worker raised, found inside Ray's wrappers (RayTaskError, UserCodeException, ...)."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        current = todo.pop()
        if current is None or any(current is s for s in seen) or len(seen) > 20:
            continue
        seen.append(current)
        if isinstance(current, ConfigError):
            return current
        todo += [getattr(current, "cause", None), current.__cause__, current.__context__]
    for line in str(error).splitlines():  # a wrapper that kept only the message
        if "ConfigError: " in line:
            return ConfigError(line.split("ConfigError: ", 1)[1].strip())
    return None


def _run(what: Callable[[], Any]) -> Any:
    try:
        return what()
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - a worker's ConfigError stays one line
        found = _config_error_in(error)
        if found is not None:
            raise found from None
        raise


# ----------------------------------------------------------------------------------------------- worker side
_shared_cache: dict[str, Any] = {}


def _shared(ref) -> dict:
    """The driver's shared values (tokenizer, blocks, plan), fetched once per worker process."""
    import ray

    key = ref.hex()
    if key not in _shared_cache:
        _shared_cache.clear()
        values = ray.get(ref)
        os.environ.update(values.get("env", {}))
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one worker per CPU already
        _shared_cache[key] = values
    return _shared_cache[key]


def _items_of(shared: dict, block: int) -> list:
    import ray

    return ray.get(shared["blocks"][block])


def _tokenize_blocks(batch: dict, *, shared_ref, tail: int) -> dict:
    shared = _shared(shared_ref)
    encoder, load = shared["encoder"], shared["load"]
    rows: dict[str, list] = {k: [] for k in ("block", "stream", "documents", "tokens", "ids", "lengths", "tail")}
    for block in batch["block"]:
        block = int(block)
        items = _items_of(shared, block)
        flat, lengths = encoder([load(item) for item in items] if load else items)
        if flat.size and int(flat.max()) > np.iinfo(np.uint32).max:
            raise ConfigError(f"token id {int(flat.max())} does not fit 32 bits (tokenizer mismatch)")
        ids = flat.astype(np.uint32)
        for key, value in (("block", block), ("stream", shared["streams"][block]), ("documents", int(lengths.size)),
                           ("tokens", int(ids.size)), ("ids", ids.tobytes()), ("lengths", lengths.tobytes()),
                           ("tail", ids[max(0, ids.size - tail):].tobytes())):
            rows[key].append(value)
    return {k: np.array(v, dtype=object if k in ("ids", "lengths", "tail") else np.int64) for k, v in rows.items()}


def _write_blocks(batch: dict, *, shared_ref, out: str, spec: ConcatSpec, vocab_size: int, compression) -> dict:
    shared = _shared(shared_ref)
    blocks, samples = [], []
    for block, ids, lengths in zip(batch["block"], batch["ids"], batch["lengths"]):
        block = int(block)
        part = objectstore.join(out, block_folder(block))
        # a block half-written by a worker that died (Ray retries it)
        objectstore.remove_tree(part, common.OUTPUT_STORES)
        writer = common.ConcatWriter(part, spec, vocab_size, compression)
        writer.carry = shared["carries"][block].astype(np.int64)
        writer.add(np.frombuffer(ids, dtype=np.uint32).astype(np.int64), np.frombuffer(lengths, dtype=np.int64))
        writer.finish()
        blocks.append(block)
        samples.append(writer.samples)
    return {"block": np.array(blocks, dtype=np.int64), "samples": np.array(samples, dtype=np.int64)}


def _finetuning_blocks(batch: dict, *, shared_ref, out: str, columns: dict, signed: str, compression) -> dict:
    shared = _shared(shared_ref)
    rows: dict[str, list] = {"block": [], "examples": [], "dropped": []}
    for block in batch["block"]:
        block = int(block)
        built = finetuning.build_examples_in_this_process(shared["tokenizer"], shared["settings"], shared["key"],
                                                          shared["preprocess"], _items_of(shared, block))
        examples = [e for e in built if e is not None]
        part = objectstore.join(out, block_folder(block))
        objectstore.remove_tree(part, common.OUTPUT_STORES)
        with common.mds_writer(columns, part, compression) as writer:
            for example in examples:
                writer.write({k: np.asarray(example[k], dtype=signed) for k in columns})
        for key, value in (("block", block), ("examples", len(examples)), ("dropped", len(built) - len(examples))):
            rows[key].append(value)
    return {k: np.array(v, dtype=np.int64) for k, v in rows.items()}


# ----------------------------------------------------------------------------------------------- driver side
def block_folder(block: int) -> str:
    return f"block-{block:05d}"


def split_into_blocks(streams: Sequence[Sequence[Any]], workers: int,
                      per_block: int | None = None) -> tuple[list[list[Any]], list[int]]:
    """Consecutive items of each stream -> (blocks in input order, the stream of each block)."""
    total = sum(len(s) for s in streams)
    per_block = per_block or max(1, min(MAX_ITEMS_PER_BLOCK, math.ceil(total / (workers * BLOCKS_PER_WORKER))))
    blocks, stream_of = [], []
    for stream, items in enumerate(streams):
        for start in range(0, len(items), per_block):
            blocks.append(list(items[start : start + per_block]))
            stream_of.append(stream)
    return blocks, stream_of


def plan_carries(summaries: list[dict], spec: ConcatSpec) -> dict[int, np.ndarray]:
    """Each block's carry: the ids a single-machine ConcatWriter holds when the block's first document arrives.

    ``summaries`` (one per block, in block order) hold ``stream``, ``tokens``, ``tail`` (uint32 bytes) and, with
    ``no_wrap``, ``lengths`` (int64 bytes). The carry is the suffix of the stream so far of a length found from
    sizes alone, cut from the tails of the blocks before it (``recent`` keeps the stream's last ids).
    """
    length = spec.concat_tokens
    carries: dict[int, np.ndarray] = {}
    stream, recent, held = None, np.empty(0, dtype=np.uint32), 0
    for row in summaries:
        if row["stream"] != stream:  # a new stream starts with nothing held
            stream, recent, held = row["stream"], np.empty(0, dtype=np.uint32), 0
        carries[row["block"]] = recent[recent.size - held:] if held else np.empty(0, dtype=np.uint32)
        if spec.no_wrap:  # replay ConcatWriter's no_wrap rule on lengths: a document that fills a sample resets it
            for size in np.frombuffer(row["lengths"], dtype=np.int64):
                held = 0 if held + int(size) >= length else held + int(size)
        else:
            held = (held + int(row["tokens"])) % length
        recent = np.concatenate([recent, np.frombuffer(row["tail"], dtype=np.uint32)])
        recent = recent[max(0, recent.size - (length - 1)):]  # a carry is shorter than one sample
    return carries


def _dataset_of_blocks(ray, count: int):
    """One row per block (``block``: its number); the items travel through the object store, not the rows."""
    return ray.data.from_items([{"block": b} for b in range(count)], override_num_blocks=max(1, count))


def _map(dataset, fn, workers: int, **fn_kwargs):
    import ray.data

    return dataset.map_batches(fn, batch_size=1, fn_kwargs=fn_kwargs, num_cpus=1,
                               compute=ray.data.TaskPoolStrategy(size=workers))


def _endpoint_env() -> dict[str, str]:
    return {name: os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)}


def write_concatenated(streams: Sequence[Sequence[Any]], tokenizer, out: str, spec: ConcatSpec, *, workers: int,
                       compression: str | None = None, load: Callable[[Any], str] | None = None,
                       per_block: int | None = None) -> dict[str, float]:
    """The ``common.write_concatenated`` of every stream, one after the other, into ``out`` on a Ray cluster.

    ``streams`` hold documents, or whatever ``load`` (run on the workers) turns into one (e.g. a file path).
    Returns the single-machine converter's counts (documents, tokens, samples) and the seconds taken.
    """
    ray = _import_ray()
    common.require_eos(tokenizer)
    if spec.concat_tokens <= 0:
        raise ConfigError(f"--concat_tokens: expected a positive sample length, got {spec.concat_tokens}")
    start = time.perf_counter()
    vocab_size = common.vocab_size_of(tokenizer)
    blocks, stream_of = split_into_blocks(streams, workers, per_block)
    workers = max(1, min(workers, len(blocks)))  # no more tasks at once than blocks
    shared = ray.put({"encoder": common._Encoder(tokenizer, spec), "load": load, "streams": stream_of,
                      "blocks": [ray.put(items) for items in blocks], "env": _endpoint_env()})
    log.info("ray: %d blocks of up to %d items on %d workers", len(blocks), max(map(len, blocks), default=0), workers)
    tokenized = _run(lambda: _map(_dataset_of_blocks(ray, len(blocks)), _tokenize_blocks, workers,
                                  shared_ref=shared, tail=spec.concat_tokens - 1).materialize())
    fields = ["block", "stream", "documents", "tokens", "tail"] + (["lengths"] if spec.no_wrap else [])
    summaries = sorted(_run(lambda: tokenized.select_columns(fields).take_all()), key=lambda row: row["block"])
    plan = ray.put({"carries": plan_carries(summaries, spec), "env": _endpoint_env()})
    written = _run(lambda: _map(tokenized, _write_blocks, workers, shared_ref=plan, out=out, spec=spec,
                                vocab_size=vocab_size, compression=compression).take_all())
    samples = common.merge_group_indexes(out, [block_folder(b) for b in range(len(blocks))])
    if samples != sum(row["samples"] for row in written):
        raise ConfigError(f"{out}: the merged index lists {samples} samples, the workers wrote "
                          f"{sum(row['samples'] for row in written)}; run the conversion again")
    counts = {name: sum(int(row[name]) for row in summaries) for name in ("documents", "tokens")}
    return {**counts, "samples": samples, "seconds": time.perf_counter() - start}


def write_finetuning(raw: Sequence[tuple[str, dict]], tokenizer, settings, key: str, out: str, *, workers: int,
                     columns: dict[str, str], signed: str, compression: str | None, preprocess_records: bool = True,
                     per_block: int | None = None) -> tuple[int, int]:
    """Finetuning examples of ``raw`` (``(where, record)`` pairs) tokenized and written as MDS on a Ray cluster, in
    the order of ``raw``; returns (examples written, examples dropped by truncation)."""
    ray = _import_ray()
    finetuning.record_preprocessor(settings, key, preprocess_records)  # a bad --preprocessor fails here, not in a worker
    blocks, _ = split_into_blocks([raw], workers, per_block)
    workers = max(1, min(workers, len(blocks)))
    shared = ray.put({"tokenizer": tokenizer, "settings": settings, "key": key, "preprocess": preprocess_records,
                      "blocks": [ray.put(items) for items in blocks], "env": _endpoint_env()})
    written = _run(lambda: _map(_dataset_of_blocks(ray, len(blocks)), _finetuning_blocks, workers, shared_ref=shared,
                                out=out, columns=columns, signed=signed, compression=compression).take_all())
    examples = common.merge_group_indexes(out, [block_folder(b) for b in range(len(blocks))])
    return examples, sum(int(row["dropped"]) for row in written)
