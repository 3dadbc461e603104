"""JSON/JSONL records and Hugging Face datasets -> tokenized, concatenated MDS (``convert_dataset_json/hf``).

Without ``--concat_tokens`` (llm-foundry's no-concat mode) the documents are written untokenized, one per sample,
in a ``text`` column; the ``text`` loader tokenizes them on the fly (truncated to ``max_seq_len``, padded).

JSON input is a ``.json``/``.jsonl`` file or a folder of them (local or s3://). A ``.jsonl`` file holds one object
per line; a ``.json`` file holds one object or a list of objects. Each object needs a string ``text`` field
(``--text_field`` to use another). A malformed line or a missing field is a ConfigError naming the file and line.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep import common, ray_data, timing
from llmfoundry.data.prep.common import ConcatSpec
from llmfoundry.data.sources import iter_records, load_hf_split
from llmfoundry.data.tokenizers import build_tokenizer

JSON_SUFFIXES = (".jsonl", ".json")
HF_READ_BATCH = 1024  # records read from a Hugging Face dataset at a time
log = logging.getLogger(__name__)


def json_files(path: str) -> list[str]:
    if path.endswith(JSON_SUFFIXES) and objectstore.read_bytes(path) is not None:
        return [path]
    files = objectstore.list_files(path, JSON_SUFFIXES)
    if not files:
        raise ConfigError(f"--path: no .json or .jsonl files at '{path}'")
    return files


def text_of(record: dict, field: str, where: str) -> str:
    if field not in record:
        raise ConfigError(f"{where}: missing field '{field}' (fields: {', '.join(sorted(record)) or 'none'}); "
                          f"add it or pass --text_field")
    value = record[field]
    if not isinstance(value, str):
        raise ConfigError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")
    return value


def iter_json_texts(path: str, field: str = "text") -> Iterator[str]:
    count = 0
    for file in json_files(path):
        for where, record in iter_records(file):
            count += 1
            yield text_of(record, field, where)
    if count == 0:
        raise ConfigError(f"--path: '{path}' holds no records")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out_root", required=True,
                        help="MDS output folder: local, or s3://, gs://, azure:// or oci://bucket/prefix")
    parser.add_argument("--compression", default="zstd", help="shard compression (zstd, gz, ...; 'none' for none)")
    parser.add_argument("--concat_tokens", type=int, default=None,
                        help="tokens per sample (tokenize and concatenate); without it the raw text is written as a "
                             "`text` column, which the text loader tokenizes on the fly")
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer id/folder, .model file, or tiktoken "
                                                          "(with --concat_tokens)")
    parser.add_argument("--tokenizer_kwargs", default=None, help="JSON object of tokenizer kwargs")
    parser.add_argument("--bos_text", default="", help="text put before every document")
    parser.add_argument("--eos_text", default=None, help="text put after every document (default: the EOS token)")
    parser.add_argument("--no_wrap", action="store_true",
                        help="a document that fills a sample ends there: the rest of it is dropped, not wrapped")
    parser.add_argument("--num_workers", "--processes", dest="num_workers", type=int, default=None,
                        help="tokenizer processes (default: all cores)")
    parser.add_argument("--text_field", default="text", help="field holding the document text")
    parser.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true",
                        help="let a Hugging Face tokenizer run its own code (passed to AutoTokenizer)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    ray_data.add_arguments(parser)
    common.add_logging_argument(parser)


def _prepare(args):
    common.set_logging_level(args.logging_level)
    ray_data.check_flags(args, {"--num_workers": args.num_workers})
    common.check_output(args.out_root, "--out_root")
    if args.ray and args.concat_tokens is None:
        raise ConfigError("--ray: tokenizes on a Ray cluster; add --concat_tokens N (raw text needs no tokenizing)")
    compression = None if str(args.compression).lower() in ("none", "") else args.compression
    if args.concat_tokens is None:  # llm-foundry's no-concat mode: raw text, tokenized by the loader
        needs = [flag for flag, value in (("--tokenizer", args.tokenizer), ("--tokenizer_kwargs", args.tokenizer_kwargs),
                                          ("--bos_text", args.bos_text), ("--eos_text", args.eos_text),
                                          ("--no_wrap", args.no_wrap), ("--trust-remote-code", args.trust_remote_code))
                 if value]
        if needs:
            raise ConfigError(f"{needs[0]}: only used when tokenizing; add --concat_tokens N (or drop "
                              f"{', '.join(needs)} to write raw text)")
        return None, None, compression, 1
    if args.tokenizer is None:
        raise ConfigError("--tokenizer: required with --concat_tokens")
    tokenizer = build_tokenizer(args.tokenizer, common.tokenizer_kwargs_from_args(args), cli=True)
    common.require_eos(tokenizer)
    eos_text = tokenizer.eos_token if args.eos_text is None else args.eos_text
    spec = ConcatSpec(args.concat_tokens, args.bos_text or "", eos_text or "", args.no_wrap)
    return tokenizer, spec, compression, args.num_workers or common.default_processes()


def _write(texts, tokenizer, out: str, spec: ConcatSpec | None, compression, processes: int, desc: str, args,
           total: int | None = None, ray_workers: int | None = None) -> None:
    show = False if args.quiet else None
    if spec is None:
        stats = common.write_texts(texts, out, compression=compression, desc=desc, total=total, show_progress=show)
        if stats["documents"] == 0:
            raise ConfigError(f"--out_root: no document written to {out}")
        print(f"wrote {stats['documents']} documents as raw text to {out}")
        return
    if ray_workers is not None:  # --ray: the same samples, tokenized and written by Ray Data workers
        stats = ray_data.write_concatenated([list(texts)], tokenizer, out, spec, workers=ray_workers,
                                            compression=compression)
    else:
        phases, start = timing.Phases(), time.perf_counter()
        stats = common.write_concatenated(texts, tokenizer, out, spec, compression=compression, processes=processes,
                                          desc=desc, total=total, show_progress=show, phases=phases)
        phases.add("wall time (this process)", time.perf_counter() - start)
        timing.publish(phases, f"{out}")
    _report(stats, out, spec.concat_tokens)


def _report(stats: dict, out: str, length: int) -> None:
    log.info("%s: %d documents, %d tokens -> %d samples", out, stats["documents"], stats["tokens"], stats["samples"])
    if stats["samples"] == 0:
        raise ConfigError(f"--concat_tokens: no sample written to {out} ({stats['tokens']} tokens < {length}); lower it or add data")
    print(f"wrote {stats['samples']} samples of {length} tokens from {stats['documents']} documents "
          f"({stats['tokens']} tokens) to {out}")


def main_json(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert_dataset_json", description="JSON/JSONL text -> MDS")
    parser.add_argument("--path", required=True, help="a .json/.jsonl file or a folder of them (local or s3://)")
    parser.add_argument("--split", default="train", help="sub-folder of --out_root to write")
    _add_common(parser)
    args = parser.parse_args(argv)
    if objectstore.is_remote(args.path):  # read through data/sources.py: s3:// only so far
        objectstore.check_url(args.path, "--path")
    tokenizer, spec, compression, processes = _prepare(args)
    out = objectstore.join(args.out_root, args.split) if args.split else args.out_root
    common.check_output_empty(out)
    with ray_data.session(args) as ray_workers:
        _write(iter_json_texts(args.path, args.text_field), tokenizer, out, spec, compression, processes,
               f"{args.split}", args, ray_workers=ray_workers)
    return 0


def main_hf(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert_dataset_hf", description="Hugging Face dataset -> MDS")
    parser.add_argument("--dataset", required=True, help="hub id, a folder saved with save_to_disk, or a builder (json)")
    parser.add_argument("--data_subset", default=None, help="dataset config name (e.g. 'en' for c4)")
    parser.add_argument("--splits", nargs="+", default=["train", "validation"], help="splits to convert")
    parser.add_argument("--data_files", nargs="*", default=None, help="data files for builder datasets (json, text)")
    _add_common(parser)
    args = parser.parse_args(argv)
    tokenizer, spec, compression, processes = _prepare(args)
    kwargs = {"data_files": args.data_files} if args.data_files else None
    with ray_data.session(args) as ray_workers:
        for split in args.splits:
            _convert_hf_split(args, split, kwargs, tokenizer, spec, compression, processes, ray_workers)
    return 0


def _convert_hf_split(args, split: str, kwargs, tokenizer, spec, compression, processes: int, ray_workers) -> None:
    data = load_hf_split(args.dataset, args.data_subset, split, kwargs)
    if len(data) == 0:
        raise ConfigError(f"--splits: split '{split}' of '{args.dataset}' is empty")
    if args.text_field not in data.column_names:
        raise ConfigError(f"--text_field: split '{split}' has no column '{args.text_field}' "
                          f"(columns: {', '.join(data.column_names)})")
    column = data.select_columns([args.text_field])

    def texts(column=column, split=split):
        i = 0
        # Arrow batches, not rows: formatting one row at a time costs as much as tokenizing a short document
        for batch in column.iter(batch_size=HF_READ_BATCH):
            for value in batch[args.text_field]:
                if not isinstance(value, str):
                    raise ConfigError(f"{args.dataset}[{split}][{i}]: field '{args.text_field}' must be a string")
                i += 1
                yield value

    out = objectstore.join(args.out_root, split)
    common.check_output_empty(out)
    _write(texts(), tokenizer, out, spec, compression, processes, split, args, total=len(data),
           ray_workers=ray_workers)
