"""JSON/JSONL records and Hugging Face datasets -> tokenized, concatenated MDS (``convert_dataset_json/hf``).

Without ``--concat_tokens`` (llm-foundry's no-concat mode) the documents are written untokenized, one per sample,
in a ``text`` column; the ``text`` loader tokenizes them on the fly (truncated to ``max_seq_len``, padded).

JSON input is a ``.json``/``.jsonl`` file or a folder of them (local or s3://). A ``.jsonl`` file holds one object
per line; a ``.json`` file holds one object or a list of objects. Each object needs a string ``text`` field
(``--text_field`` to use another). A malformed line or a missing field is a ConfigError naming the file and line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterator

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep import common
from llmfoundry.data.prep.common import ConcatSpec

JSON_SUFFIXES = (".jsonl", ".json")
log = logging.getLogger(__name__)


def json_files(path: str) -> list[str]:
    if path.endswith(JSON_SUFFIXES) and objectstore.read_bytes(path) is not None:
        return [path]
    files = objectstore.list_files(path, JSON_SUFFIXES)
    if not files:
        raise ConfigError(f"--path: no .json or .jsonl files at '{path}'")
    return files


def iter_records(path: str) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record of a JSON/JSONL file; ``where`` is 'file:line' for error messages."""
    data = objectstore.read_bytes(path)
    if data is None:
        raise ConfigError(f"{path}: file does not exist")
    text = data.decode("utf-8", errors="strict")
    stripped = text.lstrip()
    if path.endswith(".json") and stripped[:1] in ("[", "{") and not _looks_like_jsonl(stripped):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{error.lineno}: malformed JSON ({error.msg}); fix or remove this line") from None
        records = value if isinstance(value, list) else [value]
        for i, record in enumerate(records):
            yield f"{path}: record {i}", _as_object(record, f"{path}: record {i}")
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where}: malformed JSON ({error.msg} at column {error.colno}); fix or remove this line") from None
        yield where, _as_object(record, where)


def _looks_like_jsonl(text: str) -> bool:
    first_line = text.split("\n", 1)[0].strip()
    if not first_line.startswith("{"):
        return False
    try:
        json.loads(first_line)
        return "\n" in text.strip()
    except json.JSONDecodeError:
        return False


def _as_object(record, where: str) -> dict:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


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
    parser.add_argument("--out_root", required=True, help="MDS output folder, local or s3://bucket/prefix")
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
    common.add_logging_argument(parser)


def _prepare(args):
    from llmfoundry.data.tokenizers import build_tokenizer

    common.set_logging_level(args.logging_level)
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
           total: int | None = None) -> None:
    show = False if args.quiet else None
    if spec is None:
        stats = common.write_texts(texts, out, compression=compression, desc=desc, total=total, show_progress=show)
        if stats["documents"] == 0:
            raise ConfigError(f"--out_root: no document written to {out}")
        print(f"wrote {stats['documents']} documents as raw text to {out}")
        return
    stats = common.write_concatenated(texts, tokenizer, out, spec, compression=compression, processes=processes,
                                      desc=desc, total=total, show_progress=show)
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
    tokenizer, spec, compression, processes = _prepare(args)
    out = objectstore.join(args.out_root, args.split) if args.split else args.out_root
    common.check_output_empty(out)
    _write(iter_json_texts(args.path, args.text_field), tokenizer, out, spec, compression, processes, f"{args.split}",
           args)
    return 0


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_network_error(error: BaseException) -> bool:
    names = " ".join(type(e).__name__ for e in _chain(error)).lower()
    text = " ".join(str(e) for e in _chain(error)).lower()
    return (isinstance(error, ConnectionError) or "offline" in names or "connection" in names or "timeout" in names
            or "offline" in text or "couldn't reach" in text or "failed to resolve" in text)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes/contexts (datasets wraps the real problem)."""
    seen: list[BaseException] = []
    while error is not None and error not in seen and len(seen) < 10:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _data_file_list(data_files) -> list[str]:
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, dict):
        return [f for value in data_files.values() for f in _data_file_list(value)]
    return [str(f) for f in data_files or []]


def load_hf_split(dataset: str, subset: str | None, split: str, kwargs: dict | None = None, *,
                  dataset_key: str = "--dataset", split_key: str = "--splits", files_key: str = "--data_files"):
    """A split of a HF dataset: a folder saved with ``save_to_disk``, a data-file builder, or a hub id.

    Every failure is a one-line ConfigError naming the flag (or YAML key, with ``*_key``): a malformed JSON line
    by file and line, an empty data file, a hub id that cannot be loaded offline.
    """
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{dataset_key}: Hugging Face datasets needs the `datasets` package (pip install datasets)") from None
    if os.path.isdir(dataset) and (os.path.isfile(os.path.join(dataset, "dataset_dict.json"))
                                   or os.path.isfile(os.path.join(dataset, "dataset_info.json"))):
        loaded = datasets.load_from_disk(dataset)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(f"{split_key}: '{dataset}' has no split '{split}' (splits: {', '.join(loaded)})")
            return loaded[split]
        return loaded
    kwargs = dict(kwargs or {})
    files = _data_file_list(kwargs.get("data_files"))
    for file in files:
        if objectstore.is_remote(file) or any(c in file for c in "*?["):
            continue
        if not os.path.isfile(file):
            raise ConfigError(f"{files_key}: '{file}' does not exist")
        if os.path.getsize(file) < 1 << 16:  # a small file: cheap to check for "nothing but whitespace"
            with open(file, "rb") as f:
                if not f.read().strip():
                    raise ConfigError(f"{files_key}: '{file}' is empty (no records); remove it or add data")
    try:
        return datasets.load_dataset(dataset, subset, split=split, **kwargs)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure becomes one line
        raise _load_error(dataset, subset, split, files, error, dataset_key, split_key, files_key) from None


def _load_error(dataset, subset, split, files, error, dataset_key, split_key, files_key) -> ConfigError:
    first = " ".join(str(error).split())[:200] or type(error).__name__
    if files and dataset in ("json", "jsonl"):
        for file in files:  # datasets' parse errors name neither file nor line: find the first bad record
            if not objectstore.is_remote(file) and not any(c in file for c in "*?["):
                if sum(1 for _ in iter_records(file)) == 0:  # reads every line: a bad one raises with file:line
                    return ConfigError(f"{files_key}: '{file}' holds no records; remove it or add data")
    is_path = os.path.exists(dataset) or dataset in ("json", "jsonl", "csv", "text", "parquet", "arrow")
    if not is_path and (_is_network_error(error) or (_offline() and isinstance(error, (FileNotFoundError, OSError)))):
        why = "HF_HUB_OFFLINE is set" if _offline() else "no network"
        return ConfigError(
            f"{dataset_key}: the dataset '{dataset}' could not be loaded offline ({why}) and is not in the local "
            "cache; download it where there is network (datasets.load_dataset(...).save_to_disk(FOLDER)) and pass "
            f"the folder, or convert local files with --dataset json {files_key} FILE"
        )
    if isinstance(error, FileNotFoundError):
        return ConfigError(f"{dataset_key}: '{dataset}' not found ({first})")
    if isinstance(error, ValueError):
        return ConfigError(f"{split_key}: cannot load split '{split}' of '{dataset}' ({first})")
    return ConfigError(f"{dataset_key}: cannot load '{dataset}'{f' ({subset})' if subset else ''} split '{split}': "
                       f"{type(error).__name__}: {first}")


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
    for split in args.splits:
        data = load_hf_split(args.dataset, args.data_subset, split, kwargs)
        if len(data) == 0:
            raise ConfigError(f"--splits: split '{split}' of '{args.dataset}' is empty")
        if args.text_field not in data.column_names:
            raise ConfigError(f"--text_field: split '{split}' has no column '{args.text_field}' "
                              f"(columns: {', '.join(data.column_names)})")
        column = data.select_columns([args.text_field])

        def texts(column=column, split=split):
            for i, record in enumerate(column):
                value = record[args.text_field]
                if not isinstance(value, str):
                    raise ConfigError(f"{args.dataset}[{split}][{i}]: field '{args.text_field}' must be a string")
                yield value

        out = objectstore.join(args.out_root, split)
        common.check_output_empty(out)
        _write(texts(), tokenizer, out, spec, compression, processes, split, args, total=len(data))
    return 0
