"""``allow_unsafe_types`` (streaming's key): MDS shards with a pickle column are refused unless it is true."""

from __future__ import annotations

import numpy as np
import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import build_text_dataloader


def write_shards_with_a_pickle_column(folder) -> None:
    writer = import_streaming().MDSWriter(columns={"tokens": "ndarray:uint16:8", "meta": "pkl"}, out=str(folder))
    for i in range(8):
        writer.write({"tokens": np.arange(i, i + 8, dtype=np.uint16), "meta": {"source": f"doc{i}"}})
    writer.finish()


def load(folder, tokenizer, **dataset):
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(folder), max_seq_len=8, **dataset))
    return build_text_dataloader(settings, tokenizer, 4)


def test_pickle_columns_are_refused_by_default_naming_the_key(tmp_path, tokenizer):
    write_shards_with_a_pickle_column(tmp_path / "mds")
    with pytest.raises(ConfigError) as caught:
        load(tmp_path / "mds", tokenizer)
    message = str(caught.value)
    assert message.startswith("train_loader.dataset.allow_unsafe_types: ") and "pickle" in message
    assert "\n" not in message


def test_allow_unsafe_types_reads_shards_with_pickle_columns(tmp_path, tokenizer):
    write_shards_with_a_pickle_column(tmp_path / "mds")
    batch = next(iter(load(tmp_path / "mds", tokenizer, allow_unsafe_types=True)))
    assert batch["input_ids"].tolist() == [list(range(i, i + 8)) for i in range(4)]
