"""Where examples come from, for the loaders and the converters alike: JSON/JSONL records (local or s3://),
Hugging Face dataset splits, user functions named ``module:function``, and the start method of the process pools
that tokenize in parallel.

A ``.jsonl`` file holds one object per line; a ``.json`` file holds one object or a list of objects. Every failure
is a one-line ConfigError naming the file and line, or the flag / YAML key the caller passes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError


# ----------------------------------------------------------------------------------------------- JSON records
def iter_records(path: str) -> Iterator[tuple[str, dict]]:
    """(where, record) for every record of a JSON/JSONL file; ``where`` is 'file:line' for error messages."""
    data = objectstore.read_bytes(path)
    if data is None:
        raise ConfigError(f"{path}: file does not exist")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[error.start:error.start + 1]!r}); save the file "
                          "as UTF-8") from None
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
    for number, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028 and other breaks
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


# ----------------------------------------------------------------------------------------------- Hugging Face splits
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
        import datasets  # optional: only Hugging Face sources need it
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


# ----------------------------------------------------------------------------------------------- user code, processes
def callable_from_spec(spec: str, flag: str) -> Callable:
    """``module:function`` or ``path/to/file.py:function`` -> the function."""
    module_name, _, function_name = spec.partition(":")
    if not function_name:
        raise ConfigError(f"{flag}: expected 'module:function' or 'file.py:function', got '{spec}'")
    try:
        if module_name.endswith(".py"):
            loader_spec = importlib.util.spec_from_file_location("_llmfoundry_user_preprocessor", module_name)
            if loader_spec is None or loader_spec.loader is None or not os.path.isfile(module_name):
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"{flag}: cannot import '{module_name}' ({error})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"{flag}: '{module_name}' has no function '{function_name}'")
    return function


def mp_context():
    """fork where available (fast start, inherits the loaded tokenizer); spawn elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
