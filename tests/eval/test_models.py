"""Eval recipe settings take effect: models[].model is validated and built like a training model section,
loggers log, metric_names selects metrics; keys that cannot be honoured are errors."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from llmfoundry.cli import main as cli_main
from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import load_eval_config, load_gauntlet, load_icl_tasks
from llmfoundry.eval.runner import ICLEvaluator
from llmfoundry.loading import load_eval_model as load_model
from tests.eval.helpers import TINY_DATA

MC = {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"), "icl_task_type": "multiple_choice",
      "num_fewshot": [0], "limit": 4}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=256)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _recipe(models, **extra):
    return {"models": models, "icl_tasks": [MC], "max_seq_len": 128, **extra}


def _spec(model=None, **kw):
    return load_eval_config(_recipe([{"model_name": "m", **({"model": model} if model else {}), **kw}])).models[0]


def test_model_settings_are_honoured_like_in_training(hf_folder):
    base, _ = load_model(_spec({"name": "hf_causal_lm", "pretrained_model_name_or_path": str(hf_folder)}))
    assert base.config.num_hidden_layers == 2
    # config_overrides reach the config; pretrained: false gives fresh weights; attn_implementation is used
    short, _ = load_model(_spec({"pretrained_model_name_or_path": str(hf_folder),
                                 "config_overrides": {"num_hidden_layers": 1}}))
    assert short.config.num_hidden_layers == 1
    fresh, _ = load_model(_spec({"pretrained_model_name_or_path": str(hf_folder), "pretrained": False}))
    assert not torch.equal(fresh.model.embed_tokens.weight, base.model.embed_tokens.weight)
    eager, _ = load_model(_spec({"pretrained_model_name_or_path": str(hf_folder), "attn_implementation": "eager"}))
    assert eager.config._attn_implementation == "eager"
    # a Hugging Face load_path is the section's pretrained_model_name_or_path
    via_load_path, _ = load_model(_spec({"config_overrides": {"num_hidden_layers": 1}}, load_path=str(hf_folder)))
    assert via_load_path.config.num_hidden_layers == 1
    assert torch.equal(via_load_path.model.embed_tokens.weight, base.model.embed_tokens.weight)


def test_a_registered_model_section_builds_that_model(hf_folder):
    model, tokenizer = load_model(_spec(
        {"name": "mpt_causal_lm", "d_model": 16, "n_heads": 2, "n_layers": 1, "expansion_ratio": 2,
         "max_seq_len": 64, "vocab_size": 512}, tokenizer={"name": str(hf_folder)}))
    assert type(model).__name__ == "MPTForCausalLM" and len(tokenizer) <= 512


@pytest.mark.parametrize("model, message", [
    ({"name": "hf_causal_lm", "pretrained_model_name_or_path": "x", "config_overides": {}},
     "models[0].model.config_overides: unknown key (did you mean 'models[0].model.config_overrides'?)"),
    ({"name": "hf_causal_llm", "pretrained_model_name_or_path": "x"}, "models[0].model.name"),
    ({"name": "hf_causal_lm"}, "models[0].model.pretrained_model_name_or_path: required key is missing"),
    ({"name": "mpt_causal_lm", "d_model": 16, "n_heads": 3}, "models[0].model"),
])  # fmt: skip
def test_bad_model_sections_fail_at_config_time(model, message):
    with pytest.raises(ConfigError) as error:
        load_eval_config(_recipe([{"model_name": "m", "model": model}]))
    assert message in str(error.value)


def test_model_entries_need_a_source_and_unique_names(hf_folder):
    with pytest.raises(ConfigError, match="models\\[0\\]: give load_path"):
        load_eval_config(_recipe([{"model_name": "m"}]))
    with pytest.raises(ConfigError, match="model_name must be unique"):
        load_eval_config(_recipe([{"model_name": "m", "load_path": str(hf_folder)}] * 2))
    with pytest.raises(ConfigError, match="give either it or load_path"):
        load_eval_config(_recipe([{"model_name": "m", "load_path": str(hf_folder),
                                   "model": {"pretrained_model_name_or_path": "/elsewhere"}}]))


def test_a_typo_in_a_model_section_is_an_exit_2_before_anything_loads(tmp_path, hf_folder, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump(_recipe([{"model_name": "m", "model": {
        "pretrained_model_name_or_path": str(hf_folder), "trust_remote_cod": True}}])))
    assert cli_main(["eval", str(recipe)]) == 2
    assert "trust_remote_cod" in capsys.readouterr().err


def test_loggers_receive_each_models_metrics_and_gauntlet(tmp_path, hf_folder):
    log_file = tmp_path / "logs" / "eval.jsonl"
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(
        [{"model_name": "a", "load_path": str(hf_folder)},
         {"model_name": "b", "model": {"pretrained_model_name_or_path": str(hf_folder), "pretrained": False}}],
        loggers={"jsonl": {"path": str(log_file)}}, results_path=str(tmp_path / "r.json"),
        eval_gauntlet={"categories": [{"name": "math", "benchmarks": [
            {"name": "mc", "num_fewshot": 0, "random_baseline": 0.25}]}]})))
    assert cli_main(["eval", str(recipe)]) == 0
    rows = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert "hyperparameters" in rows[0] and rows[0]["hyperparameters"]["models"][0]["model_name"] == "a"
    steps = {r["step"]: r for r in rows if "step" in r}
    assert set(steps) == {0, 1}
    results = json.loads((tmp_path / "r.json").read_text())
    assert steps[0]["a/icl/mc/0-shot/accuracy"] == results["a"]["metrics"]["icl/mc/0-shot/accuracy"]
    assert steps[1]["b/icl/gauntlet/math"] == results["b"]["gauntlet"]["icl/gauntlet/math"]
    assert "b/icl/gauntlet/default_average" in steps[1]
    with pytest.raises(ConfigError, match="loggers.jsonll"):
        load_eval_config(_recipe([{"model_name": "a", "load_path": str(hf_folder)}], loggers={"jsonll": {}}))


def test_metric_names_select_the_reported_metrics(tokenizer, llama):
    def keys(**task):
        metrics = ICLEvaluator([{**MC, **task}], tokenizer, max_seq_len=128).evaluate(llama, "cpu")
        return sorted(k.rsplit("/", 1)[1] for k in metrics)

    assert keys() == ["acc", "acc_norm", "accuracy"]
    assert keys(metric_names=["InContextLearningMultipleChoiceAccuracy"]) == ["accuracy"]  # llm-foundry's name
    assert keys(metric_names=["acc_norm", "acc"]) == ["acc", "acc_norm"]
    with pytest.raises(ConfigError, match="InContextLearningLMAccuracy does not apply to multiple_choice"):
        load_icl_tasks([{**MC, "metric_names": ["InContextLearningLMAccuracy"]}])
    assert keys(metric_names=["InContextLearningMCExpectedCalibrationError"]) == ["expected_calibration_error"]
    with pytest.raises(ConfigError, match="InContextLearningLMExpectedCalibrationError does not apply to multiple"):
        load_icl_tasks([{**MC, "metric_names": ["InContextLearningLMExpectedCalibrationError"]}])


def test_gauntlet_destination_dir_is_unsupported():
    with pytest.raises(ConfigError, match="destination_dir .* is not supported yet"):
        load_gauntlet({"categories": [], "destination_dir": "/tmp/x"})
