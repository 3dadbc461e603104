"""A plugin file named in `code_paths` adds a choice rule (registry.metrics) and an ICL task type
(registry.icl_task_types) that `llmfoundry eval` and a training run score, select, feed to the gauntlet and name
in errors."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from llmfoundry import registry
from llmfoundry.cli import main as cli_main
from tests.eval.helpers import TINY_DATA, write_jsonl
from tests.helpers import tiny_recipe

PLUGIN = '''
from llmfoundry.eval.icl.tasks import MultipleChoiceTask
from llmfoundry.registry import icl_task_types, metrics


@metrics.register("last_choice")
def last_choice(scores, choice_texts):
    """Always the last choice: its accuracy follows from the gold answers alone, whatever the model."""
    return len(scores) - 1


@icl_task_types.register("true_or_false")
class TrueOrFalseTask(MultipleChoiceTask):
    """Records {"statement": ..., "true": bool}, scored as the choices 'true' and 'false'."""

    def prepare(self, records, num_fewshot):
        as_choices = [{"query": r["statement"], "choices": ["true", "false"], "gold": 0 if r["true"] else 1}
                      for r in records]
        return super().prepare(as_choices, num_fewshot)
'''
# two of six statements are false: the rule that always picks the last choice ('false') is right on a third
STATEMENTS = [{"statement": f"{a} plus {b} is {a + b + wrong}", "true": not wrong}
              for a, b, wrong in [(1, 2, 0), (2, 3, 1), (3, 4, 0), (4, 5, 0), (5, 6, 1), (6, 7, 0)]]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin file's path; what it registers is forgotten after the test, so other tests see the built-ins."""
    for reg in (registry.metrics, registry.icl_task_types):
        reg.names()  # register the built-ins before the copy that the test may add to
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    modules_before = set(sys.modules)
    path = tmp_path / "my_plugin.py"
    path.write_text(PLUGIN)
    yield str(path)
    for name in set(sys.modules) - modules_before:
        if name.startswith("llmfoundry_code_paths."):
            del sys.modules[name]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, llama, tokenizer) -> str:
    folder = tmp_path_factory.mktemp("tiny_llama")
    llama.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _recipe(tmp_path, model_folder: str, plugin: str | None, tasks: list[dict], **extra) -> str:
    recipe = {"max_seq_len": 128, "models": [{"model_name": "tiny", "load_path": model_folder}], "icl_tasks": tasks,
              "results_path": str(tmp_path / "results.json"), **extra}
    if plugin is not None:
        recipe["code_paths"] = [plugin]
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def _true_or_false(tmp_path, **settings) -> dict:
    data = write_jsonl(tmp_path / "statements.jsonl", STATEMENTS)
    return {"label": "tf", "dataset_uri": data, "icl_task_type": "true_or_false", "num_fewshot": [0, 1], **settings}


def test_a_plugins_task_type_and_choice_rule_are_scored_selected_and_averaged(tmp_path, model_folder, plugin, capsys):
    mc = {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"),
          "icl_task_type": "multiple_choice", "num_fewshot": [0]}
    gauntlet = {"metric": "last_choice", "categories": [
        {"name": "logic", "benchmarks": [{"name": "tf", "num_fewshot": 1, "random_baseline": 0.0}]}]}
    tasks = [_true_or_false(tmp_path, metric_names=["accuracy", "last_choice"]), mc]
    assert cli_main(["eval", _recipe(tmp_path, model_folder, plugin, tasks, eval_gauntlet=gauntlet)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())["tiny"]
    metrics = results["metrics"]
    for shots in (0, 1):
        assert metrics[f"icl/tf/{shots}-shot/last_choice"] == pytest.approx(1 / 3)
        assert 0.0 <= metrics[f"icl/tf/{shots}-shot/accuracy"] <= 1.0
        assert f"icl/tf/{shots}-shot/acc" not in metrics  # metric_names keeps only the two named
    # every task scored by choices reports every registered rule, the built-in task types too
    rows = [json.loads(line) for line in (TINY_DATA / "tiny_arithmetic_mc.jsonl").read_text().splitlines()]
    last_is_gold = sum(r["gold"] == len(r["choices"]) - 1 for r in rows) / len(rows)
    assert metrics["icl/mc/0-shot/last_choice"] == pytest.approx(last_is_gold)
    assert {"icl/mc/0-shot/accuracy", "icl/mc/0-shot/acc", "icl/mc/0-shot/acc_norm"} <= set(metrics)
    assert results["gauntlet"]["icl/gauntlet/logic"] == pytest.approx(1 / 3)  # the gauntlet reads the plugin's rule
    assert "| task | shots | accuracy | acc | acc_norm | last_choice |" in capsys.readouterr().out


@pytest.mark.parametrize("task_type, with_plugin, message", [
    ("true_or_fals", True, "icl_tasks[0].icl_task_type: unknown icl_task_types 'true_or_fals' (did you mean "
                           "'true_or_false'?); valid names: generation_task_with_answers, language_modeling, "
                           "multiple_choice, schema, true_or_false"),
    ("true_or_false", False, "icl_tasks[0].icl_task_type: unknown icl_task_types 'true_or_false'; valid names: "
                             "generation_task_with_answers, language_modeling, multiple_choice, schema"),
    ("code_evaluation", True, "icl_tasks[0].icl_task_type: 'code_evaluation' is not supported yet"),
])  # fmt: skip
def test_an_unknown_task_type_is_a_one_line_error_naming_the_valid_ones(tmp_path, model_folder, plugin, capsys,
                                                                        task_type, with_plugin, message):
    task = _true_or_false(tmp_path, icl_task_type=task_type)
    recipe = _recipe(tmp_path, model_folder, plugin if with_plugin else None, [task])
    capsys.readouterr()
    assert cli_main(["eval", recipe]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_metric_names_and_the_gauntlet_metric_choose_among_the_registered_rules(tmp_path, model_folder, plugin,
                                                                                 capsys):
    recipe = _recipe(tmp_path, model_folder, plugin, [_true_or_false(tmp_path, metric_names=["first_choice"])])
    assert cli_main(["eval", recipe]) == 2
    assert ("icl_tasks[0].metric_names: 'first_choice' is not supported for true_or_false tasks (tf); choose from "
            "accuracy, acc, acc_norm, last_choice, expected_calibration_error, InContextLearningMultipleChoiceAccuracy, "
            "InContextLearningMCExpectedCalibrationError, mc_expected_calibration_error") in capsys.readouterr().err
    recipe = _recipe(tmp_path, model_folder, plugin, [_true_or_false(tmp_path)],
                     eval_gauntlet={"metric": "last_choise", "categories": []})
    assert cli_main(["eval", recipe]) == 2
    assert ("eval_gauntlet.metric: unknown metrics 'last_choise' (did you mean 'last_choice'?); valid names: acc, "
            "acc_norm, accuracy, last_choice") in capsys.readouterr().err


def test_a_training_recipes_icl_tasks_use_the_plugins_task_type_and_rule(tmp_path, plugin, mds_root, tokenizer_dir):
    log = tmp_path / "metrics.jsonl"
    gauntlet = {"metric": "last_choice", "categories": [
        {"name": "logic", "benchmarks": [{"name": "tf", "num_fewshot": 0, "random_baseline": 0.0}]}]}
    recipe = tiny_recipe(mds_root, tokenizer_dir, code_paths=[plugin], max_duration="2ba", eval_interval="2ba",
                         eval_loader=None, icl_tasks=[_true_or_false(tmp_path, num_fewshot=[0],
                                                                     metric_names=["last_choice"])],
                         eval_gauntlet=gauntlet, loggers={"jsonl": {"path": str(log)}})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert cli_main(["train", str(path)]) == 0
    (evaluated,) = [row for row in map(json.loads, log.read_text().splitlines()) if "icl/tf/0-shot/last_choice" in row]
    assert evaluated["step"] == 2 and evaluated["icl/tf/0-shot/last_choice"] == pytest.approx(1 / 3)
    assert "icl/tf/0-shot/accuracy" not in evaluated
    assert evaluated["icl/gauntlet/logic"] == pytest.approx(1 / 3)
