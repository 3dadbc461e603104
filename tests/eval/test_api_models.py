"""llm-foundry's hosted-API models (openai_causal_lm, openai_chat, ...) are a one-line error saying why."""

from __future__ import annotations

import pytest
import yaml

from llmfoundry import cli

WHY = "is not available here: llm-foundry's client of a hosted API"


@pytest.fixture
def api_recipe(tmp_path):
    recipe = {"max_seq_len": 64, "device_eval_batch_size": 4,
              "icl_tasks": [{"label": "lm", "dataset_uri": "eval/local_data_tiny/tiny_counting_lm.jsonl",
                             "icl_task_type": "language_modeling", "num_fewshot": [0]}],
              "models": [{"model_name": "openai/gpt-3.5-turbo",
                          "model": {"name": "openai_chat", "version": "gpt-3.5-turbo"},
                          "tokenizer": {"name": "tiktoken", "kwargs": {"model_name": "gpt-3.5-turbo"}}},
                         {"model_name": "openai/davinci", "model": {"name": "openai_causal_lm", "version": "davinci"},
                          "tokenizer": {"name": "tiktoken", "kwargs": {"model_name": "davinci"}}}]}  # fmt: skip
    path = tmp_path / "openai_eval.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_eval_of_api_models_is_one_line_each_naming_the_harness_model(api_recipe, capsys):
    assert cli.main(["eval", str(api_recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # one line per model, as every validation problem is reported
    assert err[0] == "error: 2 problems in the config:" and len(err) == 3, err
    assert err[1].endswith("lm_eval --model openai-chat-completions)") and "'openai_chat' " + WHY in err[1]
    assert err[2].endswith("lm_eval --model openai-completions)") and "'openai_causal_lm' " + WHY in err[2]


def test_check_lists_each_api_model_as_a_problem(api_recipe, capsys):
    assert cli.main(["check", str(api_recipe)]) == 2
    out = capsys.readouterr().out
    assert f"models[0].model.name: model 'openai_chat' {WHY}" in out
    assert f"models[1].model.name: model 'openai_causal_lm' {WHY}" in out
    assert "lm_eval --model openai-completions" in out


def test_a_train_recipe_naming_an_api_model_is_refused_at_validation(tmp_path, mds_root, tokenizer_dir, capsys):
    from tests.helpers import tiny_recipe

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(mds_root, tokenizer_dir)))
    assert cli.main(["check", str(path), "model.name=fmapi_chat"]) == 2
    assert f"model.name: model 'fmapi_chat' {WHY}" in capsys.readouterr().out
