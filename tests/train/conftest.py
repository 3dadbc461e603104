"""Fixtures for trainer tests: the tiny recipe over the shared ``mds_root`` data (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_recipe


@pytest.fixture
def recipe(mds_root, tokenizer_dir):
    """recipe(**overrides) -> a tiny training recipe dict over the test MDS data."""
    return lambda **overrides: tiny_recipe(mds_root, tokenizer_dir, **overrides)
