"""Fixtures for the data tests: a folder of text files and MDS shards of 32-token samples made from it."""

from __future__ import annotations

import pytest

from tests.helpers import convert_text_folder, write_text_folder


@pytest.fixture(scope="session")
def text_folder(tmp_path_factory, corpus):
    return write_text_folder(tmp_path_factory.mktemp("texts"), corpus)


@pytest.fixture(scope="session")
def mds_folder(tmp_path_factory, text_folder, tokenizer_dir):
    """MDS shards of 32-token samples made from the whole corpus (local, one folder)."""
    return convert_text_folder(text_folder, tmp_path_factory.mktemp("mds") / "train", tokenizer_dir, 32)
