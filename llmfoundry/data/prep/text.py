"""A folder of ``.txt`` files (local or s3://) -> tokenized, concatenated MDS shards (local, s3://, gs://, Azure or
oci://).

Each file is one document. Files are split into groups (the plan is saved with the output); each group is
converted by one worker process into its own sub-folder (``part-00000/``...), and a group is marked done in
``llmfoundry_progress.json`` as soon as its shards are written. Running the same command again skips the groups
that are done, so an interrupted conversion picks up where it stopped; ``--reprocess`` starts over. When all
groups are done, a root ``index.json`` that lists every group's shards makes the output one MDS dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import asdict

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep import common, ray_data, timing
from llmfoundry.data.prep.common import ConcatSpec
from llmfoundry.data.tokenizers import build_tokenizer

PROGRESS_FILE = "llmfoundry_progress.json"
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input_folder", required=True, help="folder of .txt files, local or s3://bucket/prefix")
    parser.add_argument("--output_folder", required=True,
                        help="MDS output folder: local, or s3://, gs://, azure:// or oci://bucket/prefix")
    parser.add_argument("--concat_tokens", type=int, required=True, help="tokens per sample")
    parser.add_argument("--tokenizer", required=True, help="HF tokenizer id/folder, .model file, or tiktoken")
    parser.add_argument("--tokenizer_kwargs", default=None, help="JSON object of tokenizer kwargs")
    parser.add_argument("--bos_text", default="", help="text put before every document (e.g. the BOS token)")
    parser.add_argument("--eos_text", default=None, help="text put after every document (default: the EOS token)")
    parser.add_argument("--use_tokenizer_eos", action="store_true",
                        help="put the tokenizer's EOS token after every document (llm-foundry's flag; its default "
                             "here, so this only silences the notice; not with --eos_text)")
    parser.add_argument("--no_wrap", action="store_true",
                        help="a document that fills a sample ends there: the rest of it is dropped, not wrapped")
    parser.add_argument("--compression", default="zstd", help="shard compression (zstd, gz, ...; 'none' for none)")
    parser.add_argument("--processes", "--num_workers", type=int, default=None, help="worker processes (default: all cores)")
    parser.add_argument("--files_per_group", type=int, default=None, help="files per resumable unit of work")
    parser.add_argument("--reprocess", action="store_true", help="start over instead of resuming")
    parser.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true",
                        help="let a Hugging Face tokenizer run its own code (passed to AutoTokenizer)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    ray_data.add_arguments(parser)
    common.add_logging_argument(parser)


def _read_text(path: str) -> str:
    if objectstore.is_remote(path):
        data = objectstore.read_bytes(path)
    else:  # one open per file, no stat first: thousands of small files are read per group
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError):
            data = None
    if data is None:
        raise ConfigError(f"--input_folder: file '{path}' disappeared while converting")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}); convert it or remove it") from None


# The tokenizer of this conversion, by (name, kwargs): the parent fills it before the workers are forked, so they
# inherit the loaded tokenizer instead of loading it again for every group (a spawned worker loads it once).
_tokenizers: dict[str, object] = {}


def _tokenizer_key(name: str, kwargs: dict) -> str:
    return json.dumps([name, kwargs], sort_keys=True, default=str)


def _tokenizer_of(job: dict):
    key = _tokenizer_key(job["tokenizer"], job["tokenizer_kwargs"])
    if key not in _tokenizers:
        _tokenizers[key] = build_tokenizer(job["tokenizer"], job["tokenizer_kwargs"], cli=True)
    return _tokenizers[key]


def _init_group_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already


def _convert_group(job: dict) -> dict:
    """One group of files -> MDS in its part folder (in a worker process, or in this one with --processes 1)."""
    started = time.time()
    phases = timing.Phases()
    with phases.timed("load tokenizer"):
        tokenizer = _tokenizer_of(job)
    spec = ConcatSpec(**job["spec"])
    objectstore.remove_tree(job["out"], common.OUTPUT_STORES)  # a part left half-written by an interrupted run
    stats = common.write_concatenated(
        (_read_text(p) for p in job["files"]),
        tokenizer,
        job["out"],
        spec,
        compression=job["compression"],
        processes=1,
        show_progress=False,
        phases=phases,
    )
    return {"group": job["group"], **stats, "phases": phases.seconds, "started": started, "pid": os.getpid()}


def _settings_key(args, spec: ConcatSpec, tokenizer_kwargs: dict) -> str:
    settings = {"tokenizer": args.tokenizer, "kwargs": tokenizer_kwargs, "spec": asdict(spec), "compression": args.compression}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _eos_text(args, tokenizer) -> str:
    """What ends each document: --eos_text, else the tokenizer's EOS token (said once, as llm-foundry's converter
    appends nothing unless --use_tokenizer_eos is given)."""
    if args.use_tokenizer_eos and args.eos_text is not None:
        raise ConfigError("--use_tokenizer_eos: set it or --eos_text, not both")
    if args.eos_text is not None:
        return args.eos_text
    if not args.use_tokenizer_eos:
        print(f"notice: --eos_text is not set: documents end with the tokenizer's EOS token {tokenizer.eos_token!r} "
              "(llm-foundry's convert_text_to_mds appends nothing unless --use_tokenizer_eos; pass --eos_text '' for "
              "that)", file=sys.stderr, flush=True)
    return tokenizer.eos_token


def _plan_groups(files: list[str], files_per_group: int | None, processes: int) -> list[list[str]]:
    """Consecutive files, concatenated together (tokens left at the end of a group are dropped)."""
    per_group = files_per_group or max(1, -(-len(files) // (processes * 4)))
    return [files[i : i + per_group] for i in range(0, len(files), per_group)]


def _convert_with_ray(args, tokenizer, spec: ConcatSpec, compression, output: str, workers: int) -> dict:
    """--ray: the same groups as on one machine (with --ray-workers for --processes), each a stream of Ray blocks."""
    if args.reprocess:
        objectstore.remove_tree(output, common.OUTPUT_STORES)
    if any(objectstore.read_bytes(objectstore.join(output, name), common.OUTPUT_STORES) is not None
           for name in (PROGRESS_FILE, "index.json")):
        raise ConfigError(f"--output_folder: '{output}' already holds a conversion (--ray does not resume one); pass "
                          "--reprocess to redo it or choose another folder")
    files = objectstore.list_files(args.input_folder, (".txt",))
    if not files:
        raise ConfigError(f"--input_folder: no .txt files in '{args.input_folder}'")
    groups = _plan_groups(files, args.files_per_group, workers)
    return ray_data.write_concatenated(groups, tokenizer, output, spec, workers=workers, compression=compression,
                                       load=_read_text)


def convert(args) -> dict:
    ray_data.check_flags(args, {"--processes": args.processes})
    common.check_output(args.output_folder, "--output_folder")
    if objectstore.is_remote(args.input_folder):  # read through objectstore's whole-file helpers: s3:// only so far
        objectstore.check_url(args.input_folder, "--input_folder")
    planning = time.perf_counter()
    compression = None if str(args.compression).lower() in ("none", "") else args.compression
    tokenizer_kwargs = common.tokenizer_kwargs_from_args(args)  # with trust_remote_code: the workers get it too
    tokenizer = build_tokenizer(args.tokenizer, tokenizer_kwargs, cli=True)
    common.require_eos(tokenizer)
    eos_text = _eos_text(args, tokenizer)
    spec = ConcatSpec(args.concat_tokens, args.bos_text or "", eos_text or "", args.no_wrap)
    if spec.concat_tokens <= 0:
        raise ConfigError(f"--concat_tokens: expected a positive sample length, got {spec.concat_tokens}")
    processes = args.processes or common.default_processes()
    output = args.output_folder.rstrip("/")
    key = _settings_key(args, spec, {k: v for k, v in tokenizer_kwargs.items() if k != "trust_remote_code"})
    progress_path = objectstore.join(output, PROGRESS_FILE)
    if args.ray:
        with ray_data.session(args) as workers:
            totals = _convert_with_ray(args, tokenizer, spec, compression, output, workers)
        _check_written(totals, spec)
        return totals

    if args.reprocess:
        objectstore.remove_tree(output, common.OUTPUT_STORES)
    saved = objectstore.read_bytes(progress_path, common.OUTPUT_STORES)
    progress = json.loads(saved) if saved else None
    if progress is not None and progress.get("settings") != key:
        raise ConfigError(
            f"--output_folder: '{output}' holds a conversion with other settings (tokenizer, concat_tokens, bos/eos "
            "text or compression); pass --reprocess to start over or choose another folder"
        )
    if progress is None:
        if objectstore.read_bytes(objectstore.join(output, "index.json"), common.OUTPUT_STORES) is not None:
            raise ConfigError(f"--output_folder: '{output}' already holds an MDS dataset; pass --reprocess to redo it")
        files = objectstore.list_files(args.input_folder, (".txt",))
        if not files:
            raise ConfigError(f"--input_folder: no .txt files in '{args.input_folder}'")
        groups = _plan_groups(files, args.files_per_group, processes)
        log.info("found %d .txt files in %s: %d groups of up to %d files", len(files), args.input_folder, len(groups),
                 len(groups[0]))
        progress = {"settings": key, "groups": groups, "done": {}}
        objectstore.write_bytes(progress_path, json.dumps(progress).encode(), common.OUTPUT_STORES)

    groups = progress["groups"]
    parts = [f"part-{i:05d}" for i in range(len(groups))]
    todo = [i for i in range(len(groups)) if str(i) not in progress["done"]]
    jobs = [
        {
            "group": i,
            "files": groups[i],
            "out": objectstore.join(output, parts[i]),
            "tokenizer": args.tokenizer,
            "tokenizer_kwargs": tokenizer_kwargs,
            "spec": asdict(spec),
            "compression": compression,
        }
        for i in todo
    ]
    start = time.perf_counter()
    if len(todo) < len(groups):
        print(f"resuming: {len(groups) - len(todo)} of {len(groups)} groups already converted", flush=True)
    bar = common.Progress("text -> MDS", total=sum(len(groups[i]) for i in todo), unit="file", disable=args.quiet or None)
    phases, first_start = timing.Phases(), {}
    groups_json = json.dumps(groups)  # the file list does not change: serialized once, not after every group
    phases.add("list files, load tokenizer, plan", start - planning)

    def record(result: dict) -> None:
        progress["done"][str(result["group"])] = {k: result[k] for k in ("documents", "tokens", "samples")}
        log.debug("group %d done: %d documents, %d tokens, %d samples", result["group"], result["documents"],
                  result["tokens"], result["samples"])
        phases.merge(result["phases"])
        first_start.setdefault(result["pid"], result["started"])
        first_start[result["pid"]] = min(first_start[result["pid"]], result["started"])
        with phases.timed("record progress"):
            objectstore.write_bytes(progress_path, _progress_json(progress, groups_json), common.OUTPUT_STORES)
        bar.update(len(groups[result["group"]]))

    _tokenizers.clear()
    _tokenizers[_tokenizer_key(args.tokenizer, tokenizer_kwargs)] = tokenizer  # inherited by forked workers
    try:
        if processes <= 1 or len(jobs) <= 1:
            previous = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as in a worker: one core
            try:
                for job in jobs:
                    record(_convert_group(job))
            finally:
                _restore_env("TOKENIZERS_PARALLELISM", previous)
        else:
            pool_start = time.time()
            with phases.timed("start worker processes"):
                pool = common.start_pool(min(processes, len(jobs)), initializer=_init_group_worker)
            with pool:
                for result in pool.imap_unordered(_convert_group, jobs):
                    record(result)
            # from asking for the pool to each worker's first group starting, summed over the workers
            phases.add("worker start-up latency", sum(t - pool_start for t in first_start.values()))
    finally:
        bar.close()
        _tokenizers.clear()
    with phases.timed("merge group indexes"):
        samples = common.merge_group_indexes(output, parts)
    totals = {k: sum(d[k] for d in progress["done"].values()) for k in ("documents", "tokens", "samples")}
    totals["seconds"] = time.perf_counter() - start
    phases.add("wall time (this process)", time.perf_counter() - planning)
    timing.publish(phases, "convert_text_to_mds")
    if samples != totals["samples"]:
        raise ConfigError(f"--output_folder: index lists {samples} samples, expected {totals['samples']}; rerun with --reprocess")
    _check_written(totals, spec)
    return totals


def _progress_json(progress: dict, groups_json: str) -> bytes:
    """``json.dumps(progress)``, byte for byte, with the serialized ``groups`` reused."""
    items = (f"{json.dumps(k)}: {groups_json if k == 'groups' else json.dumps(v)}" for k, v in progress.items())
    return ("{" + ", ".join(items) + "}").encode()


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _check_written(totals: dict, spec: ConcatSpec) -> None:
    if totals["samples"] == 0:
        raise ConfigError(
            f"--concat_tokens: no sample was written ({totals['tokens']} tokens in all < {spec.concat_tokens} per sample); "
            "lower --concat_tokens or add text"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert_text_to_mds", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    common.set_logging_level(args.logging_level)
    stats = convert(args)
    print(
        f"wrote {stats['samples']} samples of {args.concat_tokens} tokens from {stats['documents']} files "
        f"({stats['tokens']} tokens) to {args.output_folder}"
    )
    return 0
