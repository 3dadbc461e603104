"""`llmfoundry eval` and the lm-eval adapter on models stored in S3 (a moto server on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import boto3
import pytest
import torch
import yaml

from llmfoundry import registry
from llmfoundry.cli import main as cli_main
from llmfoundry.eval.runner import ICLEvaluator
from llmfoundry.inference.lm_eval_adapter import LLMFoundryLM
from llmfoundry.loading import load_model
from llmfoundry.models.hf_export import export_hf
from llmfoundry.train.checkpointer import Checkpointer
from llmfoundry.train.components import weights_of
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.settings import CheckpointUploadConfig
from tests.eval.helpers import TINY_DATA
from tests.helpers import S3_TEST_BUCKET as BUCKET

pytestmark = pytest.mark.s3
TASKS = [{"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"), "icl_task_type": "multiple_choice",
          "num_fewshot": [0], "limit": 6},
         {"label": "lm", "dataset_uri": str(TINY_DATA / "tiny_counting_lm.jsonl"), "icl_task_type": "language_modeling",
          "num_fewshot": [1], "limit": 6}]


def _train_config(tokenizer_dir) -> dict:
    """The config.yaml of a tiny MPT run (what load_checkpoint_model rebuilds the model from)."""
    return {
        "max_seq_len": 64,
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 4, "no_bias": True,
                  "max_seq_len": 64, "vocab_size": 512, "attn_config": {"attn_impl": "torch", "alibi": True},
                  "learned_pos_emb": False},
        "tokenizer": {"name": str(tokenizer_dir)},
        "train_loader": {"name": "text", "dataset": {"local": "unused", "split": "train", "max_seq_len": 64}},
        "optimizer": {"name": "decoupled_adamw", "lr": 1e-3},
        "max_duration": "1ba",
        "global_train_batch_size": 2,
    }


@pytest.fixture
def s3_model(s3_server, tmp_path, tokenizer, tokenizer_dir, monkeypatch):
    """(run url, the checkpoint's model, its config): one checkpoint saved to s3:// by the trainer's Checkpointer."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # downloads are staged under the temp folder
    (tmp_path / "tmp").mkdir()
    config = _train_config(tokenizer_dir)
    cfg = validate(config, TrainConfig)
    torch.manual_seed(3)
    model = registry.models.get("mpt_causal_lm").builder(cfg.model.settings, tokenizer).eval()
    url = f"s3://{BUCKET}/runs/quickstart"
    saver = Checkpointer(url, CheckpointUploadConfig(staging_folder=str(tmp_path / "staging")))
    saver.save("ep0-ba1", weights_of(model), config=config, tokenizer=tokenizer)
    assert saver.finish(60)
    return url, model, config


def _upload_folder(folder: Path, url: str) -> None:
    bucket, _, prefix = url[len("s3://") :].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    for path in folder.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")


def test_llmfoundry_eval_scores_s3_checkpoints_and_hf_folders(s3_model, tmp_path, tokenizer, capsys):
    url, model, config = s3_model
    expected = ICLEvaluator(TASKS, tokenizer, batch_size=8, max_seq_len=64).evaluate(model, "cpu")
    # the same weights as a Hugging Face folder (llmfoundry convert's export) in S3
    hf_local = tmp_path / "hf"
    export_hf(model, tokenizer, hf_local)
    _upload_folder(hf_local, f"s3://{BUCKET}/exports/quickstart-hf")

    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({
        "max_seq_len": 64, "device_eval_batch_size": 8, "icl_tasks": TASKS,
        "models": [
            {"model_name": "save_folder", "load_path": url},  # its newest complete checkpoint
            {"model_name": "checkpoint", "load_path": f"{url}/ep0-ba1"},
            {"model_name": "hf_export", "load_path": f"s3://{BUCKET}/exports/quickstart-hf"},
            {"model_name": "with_section", "load_path": url,  # llm-foundry style: model section + load_path
             "model": {k: v for k, v in config["model"].items()}},
        ],
    }))
    results_path = tmp_path / "results.json"
    assert cli_main(["eval", str(recipe), f"results_path={results_path}"]) == 0, capsys.readouterr().err
    results = json.loads(results_path.read_text())
    for name in ("save_folder", "checkpoint", "with_section"):
        assert results[name]["metrics"] == expected, name
    for key, value in expected.items():
        assert results["hf_export"]["metrics"][key] == pytest.approx(value, abs=1e-9), key


def test_a_missing_s3_model_is_a_one_line_error(s3_server, tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({"icl_tasks": TASKS, "models": [
        {"model_name": "gone", "load_path": f"s3://{BUCKET}/runs/nothing-here"}]}))
    assert cli_main(["eval", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "models.gone.load_path" in err and "holds no complete checkpoint" in err, err


def test_lm_eval_adapter_loads_from_s3(s3_model):
    url, model, _ = s3_model
    lm = LLMFoundryLM.from_path(url)
    for (name, a), b in zip(lm.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_generate_and_convert_read_models_from_s3(s3_model, tmp_path, capsys):
    url, model, _ = s3_model
    loaded, _ = load_model(url)
    for (name, a), b in zip(loaded.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert cli_main(["generate", url, "--prompt", "1 2 3", "--max_new_tokens", "4"]) == 0
    assert "### completion 0" in capsys.readouterr().out
    assert cli_main(["convert", f"{url}/ep0-ba1", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    capsys.readouterr()
    assert cli_main(["generate", f"s3://{BUCKET}/runs/nothing-here", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == f"error: model: 's3://{BUCKET}/runs/nothing-here' holds no complete checkpoint"
