"""llm-foundry's preprocessing_fn: built-in preprocessors chosen by hf_name, registered names, column mappings.

Records use the field names of the hub datasets llm-foundry's recipes name; nothing is downloaded (a local folder
named like the hub id stands in for it, as datasets.load_dataset reads a local folder of that name first).
"""

from __future__ import annotations

import json

import pytest

from llmfoundry import registry
from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
from llmfoundry.data.loader_settings import FinetuningLoaderSettings
from llmfoundry.data.preprocessors import DOLLY_PROMPT, resolve_preprocessor
from llmfoundry.data.text import IGNORE_INDEX

KEY = "train_loader.dataset.preprocessing_fn"
HUB_IDS = ["tatsu-lab/alpaca", "HuggingFaceH4/databricks_dolly_15k", "bigscience/P3", "Muennighoff/P3",
           "Muennighoff/flan", "teknium/OpenHermes-2.5", "math-ai/StackMathQA", "AI-MO/NuminaMath-CoT"]


def auto(hf_name: str, record: dict) -> dict:
    """What the preprocessor chosen for ``hf_name`` (no preprocessing_fn set) makes of ``record``."""
    preprocess = resolve_preprocessor(None, hf_name, KEY)
    assert preprocess is not None, f"no preprocessor registered for {hf_name}"
    return preprocess(record)


def test_every_hub_dataset_of_llm_foundry_has_its_registered_preprocessor():
    assert set(HUB_IDS) <= set(registry.preprocessors.names())
    assert resolve_preprocessor(None, "mosaicml/dolly_hhrlhf", KEY) is None  # already prompt/response
    assert resolve_preprocessor(None, None, KEY) is None


def test_alpaca_prompt_runs_through_the_response_mark():
    text = "Below is an instruction.\n\n### Instruction:\nSay hi\n\n### Response:\nhi there"
    assert auto("tatsu-lab/alpaca", {"instruction": "Say hi", "input": "", "output": "hi there", "text": text}) == {
        "prompt": "Below is an instruction.\n\n### Instruction:\nSay hi\n\n### Response:", "response": "\nhi there"}
    with pytest.raises(ValueError, match="exactly once"):
        auto("tatsu-lab/alpaca", {"text": "no mark here"})


def test_dolly_joins_instruction_and_non_empty_input_in_the_instruction_template():
    row = {"instruction": "Name a fruit", "input": "", "output": "apple", "category": "open_qa"}
    assert auto("HuggingFaceH4/databricks_dolly_15k", row) == {
        "prompt": DOLLY_PROMPT.format(instruction="Name a fruit"), "response": "apple"}
    row["input"] = "It is red."
    prompt = auto("HuggingFaceH4/databricks_dolly_15k", row)["prompt"]
    assert prompt.startswith("Below is an instruction that describes a task.")
    assert prompt.endswith("### Instruction:\nName a fruit\nIt is red.\n\n### Response:\n")


def test_p3_and_muennighoff_inputs_targets():
    row = {"inputs": "Is the sky blue?", "targets": "yes", "dataset": "x"}
    assert auto("bigscience/P3", row) == {"prompt": "Is the sky blue?:", "response": "yes"}
    for name in ("Muennighoff/P3", "Muennighoff/flan"):
        assert auto(name, row) == {"prompt": "Is the sky blue?", "response": " yes"}  # a space at the seam
        assert auto(name, {"inputs": "Q:\n", "targets": "yes"}) == {"prompt": "Q:\n", "response": "yes"}
        assert auto(name, {"inputs": "Q:", "targets": "\tyes"}) == {"prompt": "Q:", "response": "\tyes"}


def test_chat_datasets_become_messages():
    hermes = {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"},
                                {"from": "gpt", "value": "4", "weight": 1.0}], "source": "x"}
    assert auto("teknium/OpenHermes-2.5", hermes) == {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]}
    assert auto("math-ai/StackMathQA", {"Q": "1+1?", "A": "2", "meta": {"url": "u"}}) == {"messages": [
        {"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}
    messages = [{"role": "user", "content": "p"}, {"role": "assistant", "content": "s"}]
    assert auto("AI-MO/NuminaMath-CoT", {"source": "x", "problem": "p", "solution": "s", "messages": messages}) == {
        "messages": messages}


def write_rows(folder, rows):
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def loader(tokenizer, **dataset):
    dataset = {"split": "train", "max_seq_len": 64, "allow_pad_trimming": True, **dataset}
    settings = validate({"dataset": dataset, "drop_last": False}, FinetuningLoaderSettings, "train_loader")
    return build_finetuning_dataloader(settings, tokenizer, 2)


def test_loader_chooses_the_preprocessor_registered_for_hf_name(tmp_path, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)  # hf_name names a local folder, as the hub id would name the hub dataset
    write_rows(tmp_path / "bigscience" / "P3", [{"inputs": "the cat", "targets": " runs"}] * 2)
    batch = next(iter(loader(tokenizer, hf_name="bigscience/P3")))
    prompt = tokenizer("the cat:")["input_ids"]
    response = tokenizer(" runs", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert batch["input_ids"][0].tolist() == prompt + response
    assert batch["labels"][0].tolist() == [IGNORE_INDEX] * len(prompt) + response


def test_registered_name_and_column_mapping_as_preprocessing_fn(tmp_path, tokenizer):
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"question": "the cat", "answer": " runs", "id": i}) for i in range(2)))
    files = {"hf_name": "json", "hf_kwargs": {"data_files": str(data)}}
    mapped = next(iter(loader(tokenizer, **files, preprocessing_fn={"prompt": "question", "response": "answer"})))
    expected = tokenizer("the cat")["input_ids"] + tokenizer(" runs", add_special_tokens=False)["input_ids"]
    assert mapped["input_ids"][0].tolist() == expected + [tokenizer.eos_token_id]

    data.write_text(json.dumps({"inputs": "the cat", "targets": " runs"}))
    named = next(iter(loader(tokenizer, **files, preprocessing_fn="bigscience/P3")))
    assert named["input_ids"][0].tolist()[: len(tokenizer("the cat:")["input_ids"])] == tokenizer("the cat:")["input_ids"]


def test_bad_preprocessing_fn_and_records_are_one_line_errors(tmp_path, tokenizer, monkeypatch):
    with pytest.raises(ConfigError, match=r"preprocessing_fn: a column mapping needs exactly the keys prompt and "):
        loader(tokenizer, hf_name="json", preprocessing_fn={"prompt": "question"})
    with pytest.raises(ConfigError, match=r"dataset\.mapping: not a key of llm-foundry's finetuning dataset.*"
                                          r"preprocessing_fn: \{prompt: COLUMN"):
        loader(tokenizer, hf_name="json", mapping={"prompt": "question", "response": "answer"})
    with pytest.raises(ConfigError, match="neither a registered preprocessor"):
        loader(tokenizer, hf_name="json", hf_kwargs={"data_files": "x.jsonl"}, preprocessing_fn="no_such_name")

    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "tatsu-lab" / "alpaca", [{"instruction": "hi", "output": "there"}])
    with pytest.raises(ConfigError) as caught:
        loader(tokenizer, hf_name="tatsu-lab/alpaca")
    message = str(caught.value)
    assert "[train][0]: the preprocessor registered for 'tatsu-lab/alpaca' cannot format this record" in message
    assert "missing field 'text'" in message and "\n" not in message


def test_converter_applies_the_registered_preprocessor_unless_skip_preprocessing(tmp_path, tokenizer_dir,
                                                                                monkeypatch, capsys):
    from llmfoundry.cli import run_main
    from llmfoundry.data.prep.finetuning import main

    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "math-ai" / "StackMathQA", [{"Q": "1+1?", "A": "2"}] * 3)
    args = ["--dataset", "math-ai/StackMathQA", "--tokenizer", str(tokenizer_dir), "--max_seq_len", "64",
            "--num_workers", "2"]  # the registered preprocessor is found in the worker processes too
    assert run_main(main, [*args, "--out_root", "out"]) == 0
    assert (tmp_path / "out" / "train" / "index.json").is_file()
    capsys.readouterr()
    assert run_main(main, [*args, "--out_root", "raw", "--skip-preprocessing"]) == 2
    assert "missing field 'prompt'" in capsys.readouterr().err  # the raw record: not formatted
