"""Helpers for the eval tests (fixtures are in conftest.py): the shipped tiny task files and a JSONL writer."""

from __future__ import annotations

import json
from pathlib import Path

TINY_DATA = Path(__file__).resolve().parents[2] / "eval" / "local_data_tiny"


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
