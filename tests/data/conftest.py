"""Fixtures for the data tests: a folder of text files and MDS shards made from it."""

from __future__ import annotations

import pytest


def write_text_folder(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_text(doc)
    return folder


@pytest.fixture(scope="session")
def text_folder(tmp_path_factory, corpus):
    return write_text_folder(tmp_path_factory.mktemp("texts"), corpus)


@pytest.fixture(scope="session")
def mds_folder(tmp_path_factory, text_folder, tokenizer_dir):
    """MDS shards of 32-token samples made from the corpus (local)."""
    from llmfoundry.data.prep.text import main

    out = tmp_path_factory.mktemp("mds") / "train"
    argv = ["--input_folder", str(text_folder), "--output_folder", str(out), "--concat_tokens", "32",
            "--tokenizer", str(tokenizer_dir), "--processes", "1", "--quiet"]
    assert main(argv) == 0
    return out
