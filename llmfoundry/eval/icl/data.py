"""Reading ICL task files: local JSONL, ``s3://bucket/key`` JSONL, or ``hf://org/name`` Hugging Face datasets."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from llmfoundry.config.errors import ConfigError


def _read_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
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


def _download_s3(uri: str, key: str) -> Path:
    import boto3

    bucket, _, obj = uri[len("s3://") :].partition("/")
    if not bucket or not obj:
        raise ConfigError(f"{key}: '{uri}' is not of the form s3://bucket/key")
    client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
    fd, tmp = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    client.download_file(bucket, obj, tmp)
    return Path(tmp)


def _load_hf(uri: str, loading_vars: dict[str, Any], parsing_map: dict[str, Any]) -> list[dict[str, Any]]:
    from datasets import load_dataset  # optional dependency, only for hf:// URIs

    dataset = load_dataset(uri[len("hf://") :], **loading_vars)
    rows = [dict(r) for r in dataset]
    if parsing_map:
        rows = [{k: " ".join(str(r[c]) for c in cols) for k, cols in parsing_map.items()} for r in rows]
    return rows


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
        records = _load_hf(uri, hf_loading_vars or {}, hf_parsing_map or {})
    elif uri.startswith("s3://"):
        path = _download_s3(uri, key)
        try:
            records = _read_jsonl(path, key)
        finally:
            path.unlink(missing_ok=True)
    else:
        path = Path(uri)
        if not path.is_file():
            raise ConfigError(
                f"{key}: task file '{uri}' does not exist (build eval/local_data with eval/prepare_data.py "
                "or copy a local_data folder there; see eval/README.md)"
            )
        records = _read_jsonl(path, key)
    if not records:
        raise ConfigError(f"{key}: task file '{uri}' has no records")
    return [strip_record(r) for r in records] if strip else records
