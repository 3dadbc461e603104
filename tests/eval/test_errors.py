"""Bad task settings and unreadable task files are one-line ConfigErrors naming the task, never tracebacks."""

from __future__ import annotations

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from llmfoundry.cli import main as cli_main
from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import load_icl_tasks
from llmfoundry.eval.icl.data import check_task_files
from llmfoundry.eval.icl.scoring import generate_greedy
from llmfoundry.eval.runner import ICLEvaluator
from tests.eval.helpers import TINY_DATA, write_jsonl

QA = {"label": "qa", "dataset_uri": str(TINY_DATA / "tiny_multiplication_qa.jsonl"), "num_fewshot": [0],
      "icl_task_type": "generation_task_with_answers", "continuation_delimiter": "\nA: ",
      "generation_kwargs": {"max_new_tokens": 3}}


def _one_line(error: pytest.ExceptionInfo, *parts: str) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, text
    return text


def test_generation_kwargs_may_override_eos_and_pad_token_ids(tokenizer, llama):
    prompt = [tokenizer("the model learns", add_special_tokens=False)["input_ids"]]
    free = generate_greedy(llama, tokenizer, prompt, device="cpu", max_new_tokens=4)[0]
    first = tokenizer(free, add_special_tokens=False)["input_ids"][0]
    # the first greedy token declared the EOS: generation stops right after it
    stopped = generate_greedy(llama, tokenizer, prompt, device="cpu", max_new_tokens=4,
                              generation_kwargs={"eos_token_id": first, "pad_token_id": 0})[0]
    assert tokenizer(stopped, add_special_tokens=False)["input_ids"] == [first]
    # and through a task: no "got multiple values for keyword argument"
    task = {**QA, "generation_kwargs": {"max_new_tokens": 3, "eos_token_id": 0, "pad_token_id": 0}}
    metrics = ICLEvaluator([task], tokenizer, max_seq_len=128).evaluate(llama, "cpu")
    assert 0.0 <= metrics["icl/qa/0-shot/accuracy"] <= 1.0


def test_generation_kwargs_that_generate_rejects_are_a_config_error(tokenizer, llama):
    task = {**QA, "generation_kwargs": {"max_new_tokens": 3, "not_a_generate_kwarg": 1}}
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([task], tokenizer, max_seq_len=128).evaluate(llama, "cpu")
    _one_line(error, "icl_tasks.qa.generation_kwargs:", "not_a_generate_kwarg")


@pytest.mark.s3
def test_a_missing_s3_task_file_names_the_task_and_uri(tokenizer, s3_server):
    uri = "s3://llmfoundry-test/tasks/missing.jsonl"
    task = {**QA, "label": "remote", "dataset_uri": uri}
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([task], tokenizer)
    _one_line(error, "icl_tasks.remote.dataset_uri", uri, "not found")
    with pytest.raises(ConfigError) as error:
        check_task_files(load_icl_tasks([task]))
    _one_line(error, "icl_tasks.remote.dataset_uri", uri)
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([{**task, "dataset_uri": "s3://no-such-bucket/x.jsonl"}], tokenizer)
    _one_line(error, "icl_tasks.remote.dataset_uri", "s3://no-such-bucket/x.jsonl")


def test_an_hf_dataset_that_cannot_be_loaded_offline_is_a_config_error(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    uri = "hf://llmfoundry-test-org/no-such-dataset"
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([{**QA, "label": "hub", "dataset_uri": uri}], tokenizer)
    _one_line(error, "icl_tasks.hub.dataset_uri", uri)


def test_an_hf_dataset_without_a_split_is_a_config_error(tokenizer, tmp_path):
    rows = [{"q": f"{a} times 2", "a": str(2 * a)} for a in range(5)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    task = {**QA, "label": "local_hf", "dataset_uri": "hf://json",
            "hf_loading_vars": {"data_files": data}, "hf_parsing_map": {"context": ["q"], "answer": ["a"]}}
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([task], tokenizer)
    _one_line(error, "icl_tasks.local_hf.dataset_uri", "hf://json", "several splits (train)", "split")
    ev = ICLEvaluator([{**task, "hf_loading_vars": {"data_files": data, "split": "train"}}], tokenizer)
    assert ev.runs[0].examples[0].answers == ["0"]
    with pytest.raises(ConfigError) as error:
        ICLEvaluator([{**task, "hf_loading_vars": {"data_files": data, "split": "train"},
                       "hf_parsing_map": {"context": ["question"], "answer": ["a"]}}], tokenizer)
    _one_line(error, "icl_tasks.local_hf.dataset_uri", "'question'")


def test_missing_task_files_are_reported_before_any_model_is_loaded(tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({
        "models": [{"model_name": "m", "load_path": str(tmp_path / "no-model-here")}],
        "icl_tasks": [{**QA, "label": "a", "dataset_uri": str(tmp_path / "a.jsonl")},
                      {**QA, "label": "b", "dataset_uri": str(tmp_path / "b.jsonl")}],
    }))
    assert cli_main(["eval", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "icl_tasks.a.dataset_uri" in err and "icl_tasks.b.dataset_uri" in err and "no-model-here" not in err


def test_plot_path_without_a_gauntlet_plots_task_accuracies(tmp_path, tokenizer, capsys):
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    folder = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=256)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({
        "models": [{"model_name": "m", "load_path": str(folder)}], "max_seq_len": 128,
        "icl_tasks": [{"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"),
                       "icl_task_type": "multiple_choice", "num_fewshot": [0], "limit": 4}],
    }))
    plot = tmp_path / "charts" / "tasks.png"
    assert cli_main(["eval", str(recipe), f"plot_path={plot}", f"results_path={tmp_path / 'r.json'}"]) == 0
    assert plot.is_file() and plot.stat().st_size > 0
    assert "task accuracy chart written" in capsys.readouterr().out
