"""The eval recipe's llm-foundry keys: eval_loader(s) with eval_subset_num_batches, icl_tasks_str /
eval_gauntlet_str, callbacks, code_paths, log_config, console_log_interval and the precision default."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from llmfoundry.cli import main as cli_main
from llmfoundry.core import notices
from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import load_eval_config
from tests.eval.helpers import TINY_DATA
from tests.helpers import make_trainer, tiny_recipe

MC = {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"), "icl_task_type": "multiple_choice",
      "num_fewshot": [0]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, mds_root, tokenizer_dir):
    """A tiny MPT trained for 2 batches and saved; its eval-loader metrics as the trainer computed them."""
    folder = tmp_path_factory.mktemp("ckpt")
    recipe = tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", eval_interval="2ba",
                         save_folder=str(folder / "run"), precision="fp32")
    trainer = make_trainer(recipe)
    metrics = trainer.fit()
    return folder / "run", {k: v for k, v in metrics.items() if k.startswith("metrics/eval/")}


def _val_loader(mds_root, seq=64):
    return {"name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": seq}, "drop_last": False}


def _write(tmp_path, recipe: dict):
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_eval_loader_metrics_equal_the_trainers_for_the_same_checkpoint(checkpoint, mds_root, tmp_path, capsys,
                                                                       monkeypatch):
    folder, trained = checkpoint
    monkeypatch.chdir(tmp_path)
    recipe = _write(tmp_path, {"max_seq_len": 64, "device_eval_batch_size": 8, "precision": "fp32",
                               "models": [{"model_name": "tiny", "load_path": str(folder)}],
                               "eval_loader": _val_loader(mds_root)})
    assert cli_main(["eval", str(recipe)]) == 0
    metrics = json.loads((tmp_path / "eval_results.json").read_text())["tiny"]["metrics"]
    assert set(metrics) == set(trained) == {"metrics/eval/LanguageCrossEntropy", "metrics/eval/LanguagePerplexity",
                                             "metrics/eval/TokenAccuracy"}
    for key, value in trained.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key
    assert "metrics/eval/LanguageCrossEntropy" in capsys.readouterr().out

    # eval_loaders: one set of metrics per label; eval_subset_num_batches: only the first batch (8 of 21 samples)
    recipe = _write(tmp_path, {"max_seq_len": 64, "device_eval_batch_size": 8, "precision": "fp32",
                               "models": [{"model_name": "tiny", "load_path": str(folder)}],
                               "eval_loaders": [{"label": "all", **_val_loader(mds_root)},
                                                {"label": "short", **_val_loader(mds_root, 32)}],
                               "icl_tasks": [MC]})
    assert cli_main(["eval", str(recipe), "eval_subset_num_batches=1"]) == 0
    subset = json.loads((tmp_path / "eval_results.json").read_text())["tiny"]
    assert {"metrics/eval/all/LanguageCrossEntropy", "metrics/eval/short/TokenAccuracy",
            "icl/mc/0-shot/accuracy"} <= set(subset["metrics"])
    assert subset["metrics"]["metrics/eval/all/LanguageCrossEntropy"] != pytest.approx(
        trained["metrics/eval/LanguageCrossEntropy"], rel=1e-6)
    # as in llm-foundry, eval_subset_num_batches applies to the ICL tasks too: one batch of 8 questions
    assert subset["sample_counts"] == {"mc/0-shot": 24}


def test_str_aliases_move_to_their_keys_and_both_set_is_an_error(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(yaml.safe_dump({"icl_tasks": [MC]}))
    gauntlet = tmp_path / "gauntlet.yaml"
    gauntlet.write_text(yaml.safe_dump({"eval_gauntlet": {"categories": [
        {"name": "math", "benchmarks": [{"name": "mc", "num_fewshot": 0, "random_baseline": 0.25}]}]}}))
    base = {"models": [{"model_name": "m", "load_path": str(tmp_path)}]}
    cfg = load_eval_config({**base, "icl_tasks_str": str(tasks), "eval_gauntlet_str": str(gauntlet)})
    assert [t.label for t in cfg.icl_tasks] == ["mc"] and cfg.eval_gauntlet.categories[0].name == "math"
    with pytest.raises(ConfigError, match="icl_tasks_str: set only one of icl_tasks and icl_tasks_str"):
        load_eval_config({**base, "icl_tasks": [MC], "icl_tasks_str": str(tasks)})
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        load_eval_config(base)
    with pytest.raises(ConfigError, match="console_log_interval"):
        load_eval_config({**base, "icl_tasks": [MC], "console_log_interval": "often"})
    assert load_eval_config({**base, "icl_tasks": [MC], "console_log_interval": "10ba"}).console_log_interval == "10ba"


def test_callbacks_code_paths_log_config_and_the_precision_notice(checkpoint, tmp_path, capsys, caplog, monkeypatch):
    folder, _ = checkpoint
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from dataclasses import dataclass\n"
        "from llmfoundry.registry import callbacks\n"
        "from llmfoundry.train.callbacks.base import Callback\n\n"
        "@dataclass\nclass Settings:\n    path: str = ''\n\n"
        "class Record(Callback):\n"
        "    def __init__(self, s):\n        self.path = s.path\n"
        "    def on_eval_end(self, run, metrics):\n"
        "        with open(self.path, 'a') as f:\n"
        "            f.write(f'{run.time.batch} {run.run_name} {sorted(metrics)[0]}\\n')\n\n"
        "@callbacks.register('record_eval', config=Settings)\n"
        "def build(s):\n    return Record(s)\n")
    record = tmp_path / "record.txt"
    monkeypatch.setattr(notices, "_seen", set())  # the precision notice is said once per process: make this the first
    recipe = _write(tmp_path, {
        "max_seq_len": 64, "device_eval_batch_size": 8, "run_name": "named",
        "code_paths": [str(plugin)],
        "models": [{"model_name": "a", "load_path": str(folder)}, {"model_name": "b", "load_path": str(folder)}],
        "icl_tasks": [MC],
        "callbacks": {"record_eval": {"path": str(record)}, "eval_output_logging": {}},
        "console_log_interval": "1ba",
    })
    assert cli_main(["eval", str(recipe)]) == 0
    assert record.read_text().splitlines() == ["0 named icl/mc/0-shot/acc", "1 named icl/mc/0-shot/acc"]
    out = capsys.readouterr()
    assert "[mc/0-shot_step_0]" in out.out and "[mc/0-shot_step_1]" in out.out  # eval_output_logging's tables
    assert "run_name: named" in out.out  # log_config: the resolved recipe is printed
    # precision defaults to amp_bf16, as in llm-foundry; on a CPU it falls back to fp32 with one notice
    if not torch.cuda.is_available():
        assert "precision: amp_bf16 (llm-foundry's default) needs a CUDA GPU with bf16" in caplog.text
        assert "evaluates in fp32" in caplog.text

    record.unlink()
    assert cli_main(["eval", str(recipe), "log_config=false", "precision=fp32", "models=[{model_name: a, "
                     f"load_path: {folder}}}]"]) == 0
    out = capsys.readouterr()
    assert "run_name: named" not in out.out
    assert record.read_text().splitlines() == ["0 named icl/mc/0-shot/acc"]


def test_training_icl_tasks_follow_eval_subset_num_batches_unless_they_set_their_own(mds_root, tokenizer_dir):
    from llmfoundry.train.icl import icl_subset
    from llmfoundry.train.recipe import TrainConfig, validate

    def subset(**keys):
        cfg = validate(tiny_recipe(mds_root, tokenizer_dir, icl_tasks=[MC], **keys), TrainConfig)
        return icl_subset(cfg.icl_subset_num_batches, cfg.eval_subset_num_batches)

    assert subset() is None
    assert subset(eval_subset_num_batches=2) == 2  # as Composer: an ICL evaluator without its own subset
    assert subset(eval_subset_num_batches=2, icl_subset_num_batches=1) == 1
