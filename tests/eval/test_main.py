"""`llmfoundry eval RECIPE.yaml` on a tiny Hugging Face folder and the project's tiny task files."""

from __future__ import annotations

import json

import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from llmfoundry.cli import main as cli_main
from tests.eval.helpers import TINY_DATA


def _hf_folder(tmp_path, tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    folder = tmp_path / "tiny_llama"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_eval_command_prints_tables_and_writes_results(tmp_path, tokenizer, capsys):
    folder = _hf_folder(tmp_path, tokenizer)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"icl_tasks": [
        {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"),
         "icl_task_type": "multiple_choice", "num_fewshot": [0]},
        {"label": "lm", "dataset_uri": str(TINY_DATA / "tiny_counting_lm.jsonl"),
         "icl_task_type": "language_modeling", "num_fewshot": [1]},
    ]}))
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({
        "max_seq_len": 128,
        "device_eval_batch_size": 8,
        "models": [{"model_name": "tiny", "load_path": str(folder)},
                   {"model_name": "tiny_again", "model": {"name": "hf_causal_lm",
                                                         "pretrained_model_name_or_path": str(folder)}}],
        "icl_tasks": str(tasks),
        "eval_gauntlet": {"categories": [
            {"name": "math", "benchmarks": [{"name": "mc", "num_fewshot": 0, "random_baseline": 0.25},
                                            {"name": "lm", "num_fewshot": 1, "random_baseline": 0.0}]}],
            "averages": {"overall": ["math"]}},
    }))
    results = tmp_path / "out" / "results.json"
    plot = tmp_path / "gauntlet.png"
    code = cli_main(["eval", str(recipe), f"results_path={results}", f"plot_path={plot}"])
    assert code == 0
    out = capsys.readouterr().out
    assert "## tiny" in out and "| task | shots | accuracy | acc | acc_norm |" in out
    assert "## gauntlet" in out and "| category | tiny | tiny_again |" in out
    data = json.loads(results.read_text())
    assert data["tiny"]["metrics"] == data["tiny_again"]["metrics"]
    assert "icl/gauntlet/overall" in data["tiny"]["gauntlet"]
    assert data["tiny"]["sample_counts"] == {"mc/0-shot": 24, "lm/1-shot": 20}
    try:
        import matplotlib  # noqa: F401

        assert plot.is_file()
    except ImportError:
        pass


def test_bad_eval_recipes_exit_2_with_a_one_line_error(tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({"models": [{"model_name": "m", "load_path": str(tmp_path)}],
                                      "icl_tasks": [{"label": "x", "dataset_uri": "y", "icl_task_typ": "schema"}]}))
    assert cli_main(["eval", str(recipe)]) == 2
    assert "icl_task_typ" in capsys.readouterr().err
