"""Fixtures for multi-process tests (launch helpers: tests/distributed/helpers.py)."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_recipe


@pytest.fixture
def dist_recipe(mds_root, tokenizer_dir):
    """A tiny recipe for 2-rank runs: no eval, jsonl metrics in the job's folder."""
    def make(**overrides):
        r = tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="8ba", python_log_level=None)
        r.update(overrides)
        return r

    return make
