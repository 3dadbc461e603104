"""ICLEvaluator end to end on tiny models and the project's tiny task files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import ICLTaskConfig, load_gauntlet, load_icl_tasks
from llmfoundry.eval.icl.scoring import plan_batches
from llmfoundry.eval.runner import ICLEvaluator
from tests.eval.helpers import TINY_DATA, write_jsonl


def tiny_tasks(**overrides):
    tasks = [
        {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"), "icl_task_type": "multiple_choice",
         "num_fewshot": [0, 2], "continuation_delimiter": "\nAnswer: "},
        {"label": "schema", "dataset_uri": str(TINY_DATA / "tiny_schema.jsonl"), "icl_task_type": "schema",
         "num_fewshot": [1]},
        {"label": "lm", "dataset_uri": str(TINY_DATA / "tiny_sequences_lm_cat.jsonl"),
         "icl_task_type": "language_modeling", "num_fewshot": 1, "has_categories": True},
        {"label": "qa", "dataset_uri": str(TINY_DATA / "tiny_multiplication_qa.jsonl"),
         "icl_task_type": "generation_task_with_answers", "num_fewshot": [1], "continuation_delimiter": "\nA: ",
         "early_stopping_criteria": ["\n"], "generation_kwargs": {"max_new_tokens": 4}},
    ]
    for t in tasks:
        t.update(overrides)
    return tasks


def test_metrics_are_named_per_task_shot_and_metric(tokenizer, llama):
    ev = ICLEvaluator(tiny_tasks(), tokenizer, batch_size=8, max_seq_len=128)
    metrics = ev.evaluate(llama, "cpu")
    for key in ["icl/mc/0-shot/accuracy", "icl/mc/2-shot/acc", "icl/mc/2-shot/acc_norm", "icl/schema/1-shot/acc",
                "icl/lm/1-shot/accuracy", "icl/lm/1-shot/numbers/accuracy", "icl/lm/1-shot/letters/accuracy",
                "icl/qa/1-shot/accuracy"]:
        assert key in metrics and 0.0 <= metrics[key] <= 1.0, key
    cats = (metrics["icl/lm/1-shot/numbers/accuracy"] + metrics["icl/lm/1-shot/letters/accuracy"]) / 2
    assert metrics["icl/lm/1-shot/accuracy"] == pytest.approx(cats)
    assert ev.sample_counts()["mc/2-shot"] == 24
    assert not llama.training


def test_packed_path_gives_the_same_metrics_as_the_plain_path(tokenizer, llama):
    tasks = [t for t in tiny_tasks() if t["label"] in ("mc", "schema", "lm")]
    on = ICLEvaluator([{**t, "kv_cache": "on"} for t in tasks], tokenizer, batch_size=5).evaluate(llama, "cpu")
    off = ICLEvaluator([{**t, "kv_cache": "off"} for t in tasks], tokenizer, batch_size=5).evaluate(llama, "cpu")
    assert on == off


def test_a_model_that_knows_the_answers_scores_one(tokenizer):
    """A model whose logits always favour the next token of the gold continuation gets accuracy 1."""

    class Oracle(torch.nn.Module):
        def __init__(self, targets):
            super().__init__()
            self.targets = targets  # prefix tuple -> next token
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None):
            logits = torch.zeros(*input_ids.shape, len(tokenizer))
            for b, row in enumerate(input_ids.tolist()):
                for t in range(len(row)):
                    nxt = self.targets.get(tuple(row[: t + 1]))
                    if nxt is not None:
                        logits[b, t, nxt] = 10.0
            return type("Out", (), {"logits": logits})()

    task = tiny_tasks()[2]
    ev = ICLEvaluator([task], tokenizer, max_seq_len=128)
    targets = {}
    for ex in ev.runs[0].examples:
        s = ex.sequences[0]
        for t in range(s.cont_start, len(s.tokens)):
            targets[tuple(s.tokens[:t])] = s.tokens[t]
    assert ev.evaluate(Oracle(targets), "cpu")["icl/lm/1-shot/accuracy"] == 1.0


def test_subset_and_limit_bound_the_work(tokenizer, gpt2):
    ev = ICLEvaluator(tiny_tasks(limit=4)[:1], tokenizer, batch_size=2)
    assert len(ev.runs[0].examples) == 4
    ev.evaluate(gpt2, "cpu")
    assert len(ev.runs[0].results) == 4
    ev = ICLEvaluator(tiny_tasks()[:1], tokenizer, batch_size=4, subset_num_batches=1)
    ev.evaluate(gpt2, "cpu")
    assert len(ev.runs[0].results) == 1  # 4 sequences = one question of 4 choices


@pytest.mark.parametrize("label, batch_size, batches, per_batch", [
    ("mc", 8, 2, 2),  # 8 sequences // 4 choices = 2 questions per batch (llm-foundry's effective batch size)
    ("mc", 3, 2, 1),  # fewer sequences than choices: still one question per batch
    ("lm", 3, 2, 3),
    ("qa", 2, 3, 2),
])  # fmt: skip
def test_icl_subset_num_batches_takes_the_first_batches_in_file_order(tokenizer, gpt2, tmp_path, label, batch_size,
                                                                       batches, per_batch):
    task = next({**t, "num_fewshot": [0]} for t in tiny_tasks() if t["label"] == label)
    if label == "mc":  # questions that grow longer down the file: sorting by length puts the last ones first
        rows = [{"query": "the cat runs " * (i + 1), "choices": ["a", "b", "c", "d"], "gold": i % 4}
                for i in range(12)]
        task["dataset_uri"] = write_jsonl(tmp_path / "growing.jsonl", rows)
    ev = ICLEvaluator([task], tokenizer, batch_size=batch_size, max_seq_len=128, subset_num_batches=batches)
    ev.evaluate(gpt2, "cpu")
    assert [r["index"] for r in ev.runs[0].results] == list(range(batches * per_batch))
    if label == "mc":  # what the old rule (sort longest first, then cut the batch list) would have scored instead
        groups = [ex.sequences for ex in ev.runs[0].examples]
        old = sorted(g for b in plan_batches(groups, batch_size, 16384)[:batches] for g in b)
        assert old != list(range(batches * per_batch))
    per_task = ICLEvaluator([{**task, "icl_subset_num_batches": batches}], tokenizer, batch_size=batch_size,
                            max_seq_len=128)
    per_task.evaluate(gpt2, "cpu")
    assert [r["index"] for r in per_task.runs[0].results] == list(range(batches * per_batch))


def test_task_configs_are_validated(tmp_path):
    with pytest.raises(ConfigError, match="icl_task_type"):
        load_icl_tasks([{"label": "x", "dataset_uri": "y", "icl_task_type": "multiple_choise", "num_fewshot": 0}])
    with pytest.raises(ConfigError, match="not supported yet"):
        load_icl_tasks([{"label": "x", "dataset_uri": "y", "icl_task_type": "code_evaluation", "num_fewshot": 0}])
    with pytest.raises(ConfigError, match="unique"):
        load_icl_tasks([{"label": "x", "dataset_uri": "y", "icl_task_type": "schema", "num_fewshot": 0}] * 2)
    path = tmp_path / "tasks.yaml"
    path.write_text("icl_tasks:\n- label: a\n  dataset_uri: b\n  icl_task_type: schema\n  num_fewshot: 3\n")
    (task,) = load_icl_tasks(str(path))
    assert task.num_fewshot == [3] and task.continuation_delimiter == " " and task.fewshot_random_seed == 1234


def test_validated_task_configs_with_an_int_num_fewshot_are_accepted():
    task = validate({"label": "a", "dataset_uri": "b", "icl_task_type": "schema", "num_fewshot": 2}, ICLTaskConfig)
    assert load_icl_tasks([task])[0].num_fewshot == [2]


def test_shipped_tiny_task_list_and_gauntlet_load(tokenizer):
    root = Path(__file__).resolve().parents[2]
    tasks = load_icl_tasks(str(root / "eval" / "yamls" / "tasks_tiny.yaml"))
    assert all((root / t.dataset_uri).is_file() for t in tasks)
    assert load_gauntlet(str(root / "eval" / "yamls" / "gauntlet_tiny.yaml")).averages


def test_llm_foundry_task_file_compatibility():
    base = {"label": "qa", "dataset_uri": "y", "num_fewshot": [0]}
    # question_answering: llm-foundry's (deprecated) name of generation_task_with_answers
    (task,) = load_icl_tasks([{**base, "icl_task_type": "question_answering"}])
    assert task.icl_task_type == "generation_task_with_answers"
    # prelimiter: llm-foundry's newer name of question_prelimiter (its task keys go to the dataset constructor)
    (task,) = load_icl_tasks([{**base, "icl_task_type": "schema", "prelimiter": "Q: "}])
    assert task.question_prelimiter == "Q: " and task.prelimiter is None
    with pytest.raises(ConfigError, match="either prelimiter or question_prelimiter"):
        load_icl_tasks([{**base, "icl_task_type": "schema", "prelimiter": "Q: ", "question_prelimiter": "A: "}])
    # num_fewshot is required, as in llm-foundry (its builder asserts 'num_fewshot' in the task)
    with pytest.raises(ConfigError) as error:
        load_icl_tasks([{"label": "x", "dataset_uri": "y", "icl_task_type": "schema"}])
    assert "icl_tasks[0].num_fewshot: required key is missing" in str(error.value)
    # a `kwargs` mapping is not a task key: the task's own keys are what llm-foundry passes to its dataset
    with pytest.raises(ConfigError) as error:
        load_icl_tasks([{**base, "icl_task_type": "schema", "kwargs": {"prompt_string": "x"}}])
    assert str(error.value).startswith("icl_tasks[0].kwargs: llm-foundry hands a task's own keys to its dataset")


def test_question_answering_tasks_run_like_generation_tasks(tokenizer, llama):
    qa = {**tiny_tasks()[3], "num_fewshot": [0]}
    alias = {**qa, "icl_task_type": "question_answering"}
    assert (ICLEvaluator([alias], tokenizer, max_seq_len=128).evaluate(llama, "cpu")
            == ICLEvaluator([qa], tokenizer, max_seq_len=128).evaluate(llama, "cpu"))
