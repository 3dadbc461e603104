"""A local MDS shard that does not match its index (truncated, replaced, bit-flipped with validate_hash set) is a
one-line error naming the file before any batch is read; streaming itself checks only what it downloads."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import build_text_dataloader

SEQ = 16


@pytest.fixture(scope="module")
def hashed_mds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hashed") / "mds"
    streaming = import_streaming()
    with streaming.MDSWriter(out=str(folder), columns={"tokens": "ndarray:uint16"}, hashes=["sha1", "xxh64"],
                             size_limit=1 << 10) as writer:
        for i in range(64):
            writer.write({"tokens": (np.arange(SEQ, dtype=np.uint16) + i) % 500})
    return folder


def load(folder, tokenizer, **dataset):
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(folder), max_seq_len=SEQ, **dataset))
    return list(build_text_dataloader(settings, tokenizer, 4))


@pytest.fixture
def copy(hashed_mds, tmp_path):
    target = tmp_path / "mds"
    shutil.copytree(hashed_mds, target)
    return target


def test_intact_shards_pass_the_checks(copy, tokenizer):
    assert len(load(copy, tokenizer, validate_hash="xxh64")) == 16


def test_a_truncated_shard_is_a_one_line_error_naming_it(copy, tokenizer):
    shard = copy / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(ConfigError, match=rf"shard '{shard}' has \d+ bytes, the index records \d+ \(truncated"):
        load(copy, tokenizer)


def test_a_flipped_bit_is_found_when_validate_hash_is_set(copy, tokenizer):
    shard = copy / "shard.00002.mds"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # inside the last sample's tokens: the size stays right
    shard.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"shard '{shard}' does not match its xxh64 checksum"):
        load(copy, tokenizer, validate_hash="xxh64")


def test_validate_hash_naming_a_checksum_the_index_lacks_is_a_config_error(copy, tokenizer):
    with pytest.raises(ConfigError, match="has no md5 checksum in its index"):
        load(copy, tokenizer, validate_hash="md5")
