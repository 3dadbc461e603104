"""Reading ICL task files: local JSONL, ``s3://bucket/key`` JSONL, or ``hf://org/name`` Hugging Face datasets."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, first_line


def _read_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    records = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                bad = raw[error.start:error.start + 1]
                raise ConfigError(f"{key}: {path}:{line_no}: not UTF-8 text (byte {bad!r}); save the file as UTF-8"
                                  ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{key}: {path}:{line_no}: invalid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{key}: {path}:{line_no}: each line must be a JSON object")
            records.append(record)
    return records


def _download(uri: str, key: str) -> Path:
    objectstore.split_url(uri, key)  # an unsupported store is a one-line error
    fd, tmp = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    try:
        objectstore.download_file(uri, tmp)
    except Exception as error:  # noqa: BLE001 - botocore raises ClientError, NoCredentialsError, EndpointConnectionError...
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"{key}: cannot download task file '{uri}' ({objectstore.problem(error)})") from None
    return Path(tmp)


def _load_hf(uri: str, loading_vars: dict[str, Any], parsing_map: dict[str, Any], key: str) -> list[dict[str, Any]]:
    try:
        from datasets import DatasetDict, IterableDatasetDict, load_dataset  # optional, only for hf:// URIs
    except ImportError:
        raise ConfigError(f"{key}: '{uri}' needs the datasets package (pip install datasets)") from None
    try:
        dataset = load_dataset(uri[len("hf://") :], **loading_vars)
    except Exception as error:  # noqa: BLE001 - offline, unknown dataset or config, bad loading vars, ...
        raise ConfigError(
            f"{key}: cannot load the Hugging Face dataset '{uri}' ({type(error).__name__}: {first_line(error)}); "
            "hf:// task files need the network or the datasets cache"
        ) from None
    if isinstance(dataset, (DatasetDict, IterableDatasetDict)):
        raise ConfigError(f"{key}: '{uri}' has several splits ({', '.join(dataset)}); choose one with "
                          "hf_loading_vars: {split: ...}")
    rows = [dict(r) for r in dataset]
    if parsing_map:
        try:
            rows = [{k: " ".join(str(r[c]) for c in cols) for k, cols in parsing_map.items()} for r in rows]
        except KeyError as error:
            columns = ", ".join(rows[0]) if rows else ""
            raise ConfigError(f"{key}: hf_parsing_map names the column {error} that '{uri}' lacks (it has: "
                              f"{columns})") from None
    return rows


def check_task_files(tasks) -> None:
    """Every local task file exists and every s3:// one can be found (one ConfigError naming each missing one), so
    that a typo shows before any model is loaded. hf:// datasets are checked when they are read."""
    problems = []
    for task in tasks:
        uri, key = task.dataset_uri, f"icl_tasks.{task.label}.dataset_uri"
        if uri.startswith("hf://"):
            continue
        if objectstore.is_remote(uri):
            try:
                bucket, obj = objectstore.split_url(uri, key)
                objectstore.client().head_object(Bucket=bucket, Key=obj)
            except ConfigError as error:
                problems.append(str(error))
            except Exception as error:  # noqa: BLE001
                problems.append(f"{key}: cannot find task file '{uri}' ({objectstore.problem(error)})")
        elif not Path(uri).is_file():
            problems.append(f"{key}: task file '{uri}' does not exist{_LOCAL_HINT}")
    if problems:
        raise ConfigError.many(problems)


_LOCAL_HINT = " (build eval/local_data with eval/prepare_data.py or copy a local_data folder there; see eval/README.md)"


def strip_record(record: dict[str, Any]) -> dict[str, Any]:
    """Every top-level string field stripped (lists such as ``choices`` are kept as they are), like llm-foundry."""
    return {k: v.strip() if isinstance(v, str) else v for k, v in record.items()}


def read_records(
    uri: str,
    *,
    strip: bool = True,
    hf_loading_vars: dict[str, Any] | None = None,
    hf_parsing_map: dict[str, Any] | None = None,
    key: str = "dataset_uri",
) -> list[dict[str, Any]]:
    """The records of a task file, in file order."""
    if uri.startswith("hf://"):
        records = _load_hf(uri, hf_loading_vars or {}, hf_parsing_map or {}, key)
    elif objectstore.is_remote(uri):
        path = _download(uri, key)
        try:
            records = _read_jsonl(path, key)
        finally:
            path.unlink(missing_ok=True)
    else:
        path = Path(uri)
        if not path.is_file():
            raise ConfigError(f"{key}: task file '{uri}' does not exist{_LOCAL_HINT}")
        records = _read_jsonl(path, key)
    if not records:
        raise ConfigError(f"{key}: task file '{uri}' has no records")
    return [strip_record(r) for r in records] if strip else records
