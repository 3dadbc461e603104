"""llm-foundry's README flow with this project's commands, each stage through the `llmfoundry` entry point:

    llmfoundry data json ...                      a local JSONL corpus -> MDS shards
    llmfoundry train RECIPE eval_interval=0 max_duration=10ba save_folder=...
    llmfoundry convert CHECKPOINT HF_FOLDER        -> a transformers-native folder
    llmfoundry eval EVAL_RECIPE                    the converted folder on an ICL task

Each stage's outputs are checked before the next one uses them.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmfoundry.cli import main as llmfoundry
from tests.eval.helpers import TINY_DATA
from tests.helpers import tiny_recipe

SEQ = 64


def test_data_prep_train_convert_eval(tmp_path, corpus, tokenizer_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 1. data prep: JSONL documents -> tokenized, concatenated MDS samples of SEQ tokens
    for split, docs in {"train": corpus[:160], "val": corpus[160:]}.items():
        source = tmp_path / f"{split}.jsonl"
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        code = llmfoundry(["data", "json", "--path", str(source), "--split", split, "--out_root", "my-copy-c4",
                           "--concat_tokens", str(SEQ), "--tokenizer", str(tokenizer_dir), "--num_workers", "1"])
        assert code == 0
        index = json.loads((tmp_path / "my-copy-c4" / split / "index.json").read_text())
        assert sum(shard["samples"] for shard in index["shards"]) >= 20
    capsys.readouterr()

    # 2. train a tiny MPT for 10 batches, no evaluation, checkpoints in save_folder
    recipe = tiny_recipe(tmp_path / "my-copy-c4", tokenizer_dir, log_to_console=True, max_duration="100ba",
                         global_train_batch_size=4, device_train_microbatch_size=4, precision="fp32")
    recipe["model"].update(expansion_ratio=4, no_bias=True)  # the MPT shape transformers' MptForCausalLM has
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    code = llmfoundry(["train", "tiny.yaml", "eval_interval=0", "max_duration=10ba", "save_folder=mpt-tiny"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "[batch 10/10]" in out and "metrics/eval" not in out  # eval_interval=0: no evaluation at all
    assert (tmp_path / "mpt-tiny" / "latest").exists()
    checkpoints = sorted(p.name for p in (tmp_path / "mpt-tiny").iterdir() if p.is_dir())
    assert checkpoints[-1].endswith("-ba10"), checkpoints

    # 3. convert the newest checkpoint to a Hugging Face folder that transformers opens without remote code
    assert llmfoundry(["convert", "mpt-tiny", "mpt-tiny-hf"]) == 0
    hf_folder = tmp_path / "mpt-tiny-hf"
    assert (hf_folder / "config.json").is_file() and (hf_folder / "tokenizer_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(hf_folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(hf_folder))
    ids = tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()
    capsys.readouterr()

    # 4. evaluate the converted folder on an ICL task and the held-out MDS split, next to the checkpoint itself
    eval_recipe = {
        "max_seq_len": SEQ * 2, "device_eval_batch_size": 8, "precision": "fp32",
        "models": [{"model_name": "mpt-tiny", "model": {"name": "hf_causal_lm",
                                                        "pretrained_model_name_or_path": str(hf_folder)},
                    "tokenizer": {"name": str(hf_folder)}},
                   {"model_name": "checkpoint", "load_path": "mpt-tiny"}],
        "icl_tasks": [{"label": "arithmetic", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"),
                       "icl_task_type": "multiple_choice", "num_fewshot": [0, 1]}],
        "eval_loader": {"name": "text", "drop_last": False,
                        "dataset": {"local": "my-copy-c4", "split": "val", "max_seq_len": SEQ}},
        "results_path": "eval-results.json",
    }
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(eval_recipe, sort_keys=False))
    assert llmfoundry(["eval", "eval.yaml"]) == 0
    out = capsys.readouterr().out
    assert "## mpt-tiny" in out and "| arithmetic | 0 |" in out and "| arithmetic | 1 |" in out
    both = json.loads((tmp_path / "eval-results.json").read_text())
    results = both["mpt-tiny"]
    assert results["sample_counts"] == {"arithmetic/0-shot": 24, "arithmetic/1-shot": 24}
    for shots in (0, 1):
        assert 0.0 <= results["metrics"][f"icl/arithmetic/{shots}-shot/accuracy"] <= 1.0
    # the export computes what the checkpoint computes
    for key, value in both["checkpoint"]["metrics"].items():
        assert results["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert {"metrics/eval/LanguageCrossEntropy", "metrics/eval/TokenAccuracy"} <= set(results["metrics"])

