"""JSON/JSONL records and Hugging Face datasets -> tokenized, concatenated MDS (``convert_dataset_json/hf``).

JSON input is a ``.json``/``.jsonl`` file or a folder of them (local or s3://). A ``.jsonl`` file holds one object
per line; a ``.json`` file holds one object or a list of objects. Each object needs a string ``text`` field
(``--text_field`` to use another). A malformed line or a missing field is a ConfigError naming the file and line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from llmfoundry.config.errors import ConfigError
from llmfoundry.data.prep import common
from llmfoundry.data.prep.common import ConcatSpec

JSON_SUFFIXES = (".jsonl", ".json")


def json_files(path: str) -> list[str]:
    if path.endswith(JSON_SUFFIXES) and common.read_bytes(path) is not None:
        return [path]
    files = common.list_files(path, JSON_SUFFIXES)
    if not files:
        raise ConfigError(f"--path: no .json or .jsonl files at '{path}'")
    return files


def iter_records(path: str) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record of a JSON/JSONL file; ``where`` is 'file:line' for error messages."""
    data = common.read_bytes(path)
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
    parser.add_argument("--concat_tokens", type=int, required=True, help="tokens per sample")
    parser.add_argument("--tokenizer", required=True, help="HF tokenizer id/folder, .model file, or tiktoken")
    parser.add_argument("--tokenizer_kwargs", default=None, help="JSON object of tokenizer kwargs")
    parser.add_argument("--bos_text", default="", help="text put before every document")
    parser.add_argument("--eos_text", default=None, help="text put after every document (default: the EOS token)")
    parser.add_argument("--no_wrap", action="store_true", help="drop the rest of a document instead of wrapping it")
    parser.add_argument("--num_workers", "--processes", dest="num_workers", type=int, default=None,
                        help="tokenizer processes (default: all cores)")
    parser.add_argument("--text_field", default="text", help="field holding the document text")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _prepare(args):
    from llmfoundry.data.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(args.tokenizer, common.parse_json_kwargs(args.tokenizer_kwargs, "--tokenizer_kwargs"))
    common.require_eos(tokenizer)
    eos_text = tokenizer.eos_token if args.eos_text is None else args.eos_text
    spec = ConcatSpec(args.concat_tokens, args.bos_text or "", eos_text or "", args.no_wrap)
    compression = None if str(args.compression).lower() in ("none", "") else args.compression
    return tokenizer, spec, compression, args.num_workers or common.default_processes()


def _report(stats: dict, out: str, length: int) -> None:
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
    out = common.join(args.out_root, args.split) if args.split else args.out_root
    common.check_output_empty(out)
    stats = common.write_concatenated(iter_json_texts(args.path, args.text_field), tokenizer, out, spec,
                                      compression=compression, processes=processes, desc=f"{args.split}",
                                      show_progress=False if args.quiet else None)
    _report(stats, out, spec.concat_tokens)
    return 0


def load_hf_split(dataset: str, subset: str | None, split: str, kwargs: dict | None = None):
    """A split of a HF dataset: a folder saved with ``save_to_disk``, a data-file builder, or a hub id."""
    import os

    try:
        import datasets
    except ImportError:
        raise ConfigError("--dataset: Hugging Face datasets needs the `datasets` package (pip install datasets)") from None
    if os.path.isdir(dataset) and (os.path.isfile(os.path.join(dataset, "dataset_dict.json"))
                                   or os.path.isfile(os.path.join(dataset, "dataset_info.json"))):
        loaded = datasets.load_from_disk(dataset)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(f"--splits: '{dataset}' has no split '{split}' (splits: {', '.join(loaded)})")
            return loaded[split]
        return loaded
    try:
        return datasets.load_dataset(dataset, subset, split=split, **(kwargs or {}))
    except ValueError as error:
        raise ConfigError(f"--splits: cannot load split '{split}' of '{dataset}': {str(error).splitlines()[0]}") from None
    except FileNotFoundError as error:
        raise ConfigError(f"--dataset: '{dataset}' not found ({str(error).splitlines()[0]})") from None


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

        out = common.join(args.out_root, split)
        common.check_output_empty(out)
        stats = common.write_concatenated(texts(), tokenizer, out, spec, compression=compression, processes=processes,
                                          desc=split, total=len(data), show_progress=False if args.quiet else None)
        _report(stats, out, spec.concat_tokens)
    return 0
