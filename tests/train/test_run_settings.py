"""Run-level keys that llm-foundry recipes carry: code_paths, log_config, the CUDA allocator settings, and
Composer's keys, accepted at their defaults (their other values: tests/train/test_llmfoundry_keys.py)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from llmfoundry.cli import main as cli
from llmfoundry.commands.train import cuda_environment
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.trainer import Trainer

PLUGIN = '''
from dataclasses import dataclass
from pathlib import Path

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback


@dataclass
class MarkSettings:
    path: str = option(doc="file written at the end of training")


class Mark(Callback):
    def __init__(self, settings):
        self.path = Path(settings.path)

    def on_fit_end(self, trainer):
        self.path.write_text(str(trainer.time.batch))


callbacks.register("mark_the_end", config=MarkSettings)(Mark)
'''


def test_code_paths_register_components_before_the_recipe_is_validated(recipe, tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    cfg = recipe(eval_loader=None, max_duration="2ba", code_paths=[str(tmp_path / "my_plugin.py")],
                 callbacks={"mark_the_end": {"path": str(tmp_path / "marked")}})  # fmt: skip
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["train", str(path)]) == 0
    assert (tmp_path / "marked").read_text() == "2"

    cfg["code_paths"] = [str(tmp_path / "missing.py")]
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["train", str(path)]) == 2


def test_log_config_false_keeps_the_config_out_of_the_loggers(recipe, tmp_path):
    for log_config in (True, False):
        out = tmp_path / f"{log_config}.jsonl"
        cfg = recipe(eval_loader=None, max_duration="1ba", log_config=log_config, loggers={"jsonl": {"path": str(out)}})
        Trainer(validate(cfg, TrainConfig), cfg).fit()
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert any("hyperparameters" in r for r in records) is log_config
        assert any(r.get("step") == 1 for r in records)


def test_cuda_allocator_keys_become_environment_variables(recipe):
    cfg = validate(recipe(max_split_size_mb=512, cuda_load_lazy=True), TrainConfig)
    assert cuda_environment(cfg, {}) == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:True",
                                         "CUDA_MODULE_LOADING": "LAZY"}  # fmt: skip
    # what the user already exported wins, and other entries are kept
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,garbage_collection_threshold:0.6"}
    assert cuda_environment(cfg, mine)["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:False,garbage_collection_threshold:0.6,max_split_size_mb:512")
    plain = validate(recipe(expandable_segments=False), TrainConfig)
    assert cuda_environment(plain, {}) == {}


@pytest.mark.parametrize("key, value, message", [
    ("save_filename", "ep{epoch}.pt", "save_filename: 'ep{epoch}.pt' cannot be used"),
    ("load_ignore_keys", ["state/x"], "load_ignore_keys: 'state/x' matches no state here"),
    ("profiler", {"schedule": {"active": 0}}, "profiler.schedule.active: must be at least 1 batch"),
])  # fmt: skip
def test_composer_keys_are_accepted_at_their_default_and_values_without_a_meaning_here_refused(recipe, key, value,
                                                                                               message):
    validate(recipe(**{key: None}), TrainConfig)  # accepted at their default, as llm-foundry recipes write them
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(recipe(**{key: value}), TrainConfig)
