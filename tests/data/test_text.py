from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.text import build_text_dataloader, check_token_ids
from tests.helpers import batch_rows


def loader(local, tokenizer, batch_size=4, drop_last=True, **dataset):
    dataset.setdefault("max_seq_len", 32)
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(local), **dataset), drop_last=drop_last)
    return build_text_dataloader(settings, tokenizer, batch_size)


def test_converter_writes_fixed_length_uint16_tokens(mds_folder, tokenizer):
    from llmfoundry.data.streaming_guard import import_streaming

    index = json.loads((mds_folder / "index.json").read_text())
    assert index["shards"][0]["column_encodings"] == ["ndarray:uint16:32"]
    ds = import_streaming().StreamingDataset(local=str(mds_folder))
    sample = ds[0]["tokens"]
    assert sample.dtype == np.uint16 and sample.shape == (32,)
    assert tokenizer.eos_token_id in {int(t) for i in range(len(ds)) for t in ds[i]["tokens"]}


def test_text_loader_yields_unshifted_labels_and_sequence_ids(mds_folder, tokenizer):
    eos = tokenizer.eos_token_id
    batch = next(iter(loader(mds_folder, tokenizer, eos_token_id=eos)))
    assert batch["input_ids"].shape == (4, 32) and batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["labels"], batch["input_ids"])
    seq = batch["sequence_id"]
    ids = batch["input_ids"]
    for r in range(4):
        for t in range(1, 32):
            assert seq[r, t] == seq[r, t - 1] + (1 if ids[r, t - 1] == eos else 0)


def test_seeded_shuffle_is_deterministic_and_seed_dependent(mds_folder, tokenizer):
    a = batch_rows(loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=3))
    b = batch_rows(loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=3))
    c = batch_rows(loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=4))
    assert a == b and a != c
    everything = batch_rows(loader(mds_folder, tokenizer, drop_last=False, shuffle=True, shuffle_seed=3))
    plain = batch_rows(loader(mds_folder, tokenizer, drop_last=False))
    assert everything != plain and sorted(everything) == sorted(plain)


def test_resume_mid_epoch_yields_exactly_the_remaining_batches(mds_folder, tokenizer):
    full = list(loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=7))
    first = loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=7)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state["sample_in_epoch"] == 12
    resumed = loader(mds_folder, tokenizer, shuffle=True, shuffle_seed=7)
    resumed.load_state_dict(state)
    assert batch_rows(resumed) == batch_rows(full[3:])


def test_missing_mds_folder_is_a_config_error(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="does not exist.*convert") as caught:
        loader(tmp_path / "nope", tokenizer)
    # our own error, unchanged (not re-wrapped as "cannot read the MDS index from None (...)")
    assert str(caught.value).startswith("train_loader.dataset.local: ")
    assert "cannot read" not in str(caught.value) and "\n" not in str(caught.value)


def test_mds_split_without_samples_is_a_config_error_naming_key_and_folder(tmp_path, tokenizer):
    from llmfoundry.data.streaming_guard import import_streaming

    import_streaming().MDSWriter(columns={"tokens": "ndarray:uint16:32"}, out=str(tmp_path / "mds" / "train")).finish()
    with pytest.raises(ConfigError) as caught:
        loader(tmp_path / "mds", tokenizer, split="train")
    message = str(caught.value)
    assert message.startswith("train_loader.dataset: ") and "\n" not in message
    assert str(tmp_path / "mds" / "train") in message and "has no samples" in message


def test_token_id_beyond_vocab_is_a_config_error():
    batch = {"input_ids": torch.tensor([[1, 2, 600]])}
    check_token_ids(batch, 601)
    with pytest.raises(ConfigError, match="vocab_size >= 601"):
        check_token_ids(batch, 512)


def test_loader_vocab_size_option_checks_batches(mds_folder, tokenizer):
    with pytest.raises(ConfigError, match="vocab_size"):
        next(iter(loader(mds_folder, tokenizer, vocab_size=10)))
