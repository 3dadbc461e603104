"""The finetuning dataset's llm-foundry keys ``safe_load`` and ``eos_token_id``, and the keys that apply to hf_name
records only."""

from __future__ import annotations

import json
import logging

import pytest

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
from llmfoundry.data.loader_settings import FinetuningLoaderSettings


def loader(tokenizer, **dataset):
    dataset = {"split": "train", "max_seq_len": 64, "allow_pad_trimming": True, **dataset}
    settings = validate({"dataset": dataset, "drop_last": False}, FinetuningLoaderSettings, "train_loader")
    return build_finetuning_dataloader(settings, tokenizer, 2)


def records_folder(folder):
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"prompt": "the cat", "response": f" runs {i}"})
                                                  for i in range(4)))
    (folder / ".gitignore").write_text("*.tmp\n")
    return folder


def test_safe_load_reads_a_folder_of_plain_data_files(tmp_path, tokenizer):
    folder = records_folder(tmp_path / "data")
    safe = [b["input_ids"].tolist() for b in loader(tokenizer, hf_name=str(folder), safe_load=True)]
    plain = [b["input_ids"].tolist() for b in loader(tokenizer, hf_name=str(folder))]
    assert safe == plain and len(safe) == 2


def test_safe_load_refuses_pickles_arrow_files_and_unsafe_data_files(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    folder = records_folder(tmp_path / "data")
    (folder / "extra.pkl").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ConfigError) as caught:
        loader(tokenizer, hf_name=str(folder), safe_load=True)
    message = str(caught.value)
    assert message.startswith("train_loader.dataset.safe_load: refusing ") and "extra.pkl" in message
    assert "\n" not in message

    saved = tmp_path / "saved"  # save_to_disk writes arrow files: refused, as llm-foundry refuses them
    datasets.Dataset.from_list([{"prompt": "a", "response": "b"}] * 2).save_to_disk(str(saved))
    assert len(loader(tokenizer, hf_name=str(saved)).dataset) == 2
    with pytest.raises(ConfigError, match=r"safe_load: refusing .*\.arrow"):
        loader(tokenizer, hf_name=str(saved), safe_load=True)

    script = tmp_path / "records.py"
    script.write_text("print('never run')\n")
    with pytest.raises(ConfigError, match=r"safe_load: refusing .*records\.py"):
        loader(tokenizer, hf_name="json", hf_kwargs={"data_files": str(script)}, safe_load=True)


def test_safe_load_of_a_hub_dataset_offline_is_one_line(tokenizer, monkeypatch, tmp_path):
    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as caught:
        loader(tokenizer, hf_name="some-org/not-cached", safe_load=True)
    message = str(caught.value)
    assert message.startswith("train_loader.dataset.hf_name: cannot download hub dataset 'some-org/not-cached' "
                              "for safe_load")
    assert "\n" not in message


def test_eos_token_id_is_unused_with_a_notice_when_it_differs(tmp_path, tokenizer, caplog):
    folder = records_folder(tmp_path / "data")
    eos = tokenizer.eos_token_id
    plain = [b["input_ids"].tolist() for b in loader(tokenizer, hf_name=str(folder))]
    with caplog.at_level(logging.WARNING, logger="llmfoundry"):
        same = [b["input_ids"].tolist() for b in loader(tokenizer, hf_name=str(folder),
                                                        eos_token_id=tokenizer.eos_token_id)]
        assert "eos_token_id" not in caplog.text
        other = [b["input_ids"].tolist() for b in loader(tokenizer, hf_name=str(folder), eos_token_id=eos + 7)]
    assert plain == same == other
    assert plain[0][0][-1] == eos
    assert (f"train_loader.dataset.eos_token_id: {eos + 7} is not the tokenizer's EOS id {eos}; "
            "responses end with the tokenizer's EOS") in caplog.text


@pytest.mark.parametrize("key, value", [("safe_load", False), ("eos_token_id", 0), ("preprocessing_fn", "m:f"),
                                        ("hf_kwargs", {"data_files": "x.jsonl"})])
def test_hf_record_keys_with_mds_data_are_errors(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"train_loader\.dataset\.{key}: applies to hf_name records, not MDS data"):
        validate({"dataset": {"local": str(tmp_path), key: value}}, FinetuningLoaderSettings, "train_loader")
