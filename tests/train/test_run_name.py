"""llm-foundry's command-line habits in a run: eval_interval=0 turns evaluation off, and {run_name} in save_folder
(and the other path keys Composer expands) becomes the run's name: the recipe's run_name, else $RUN_NAME."""

from __future__ import annotations

import json

import pytest
import yaml

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.run_name import given_run_name, resolve_run_name, with_run_name
from tests.helpers import make_trainer

EVAL_KEY = "metrics/eval/LanguageCrossEntropy"


@pytest.fixture(autouse=True)
def no_run_name_in_environment(monkeypatch):
    monkeypatch.delenv("RUN_NAME", raising=False)
    monkeypatch.delenv("COMPOSER_RUN_NAME", raising=False)


def logged_steps(path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines()) if "step" in r}


@pytest.mark.parametrize("interval", [0, "0ba"])
def test_eval_interval_zero_evaluates_neither_during_nor_after_training(recipe, tmp_path, interval):
    """As Composer: an interval of 0 never evaluates, not even at the end of training (eval_loader is set)."""
    path = tmp_path / "metrics.jsonl"
    trainer = make_trainer(recipe(max_duration="3ba", eval_interval=interval, loggers={"jsonl": {"path": str(path)}}))
    trainer.fit()
    steps = logged_steps(path)
    assert sorted(steps) == [1, 2, 3]
    assert not any(EVAL_KEY in row for row in steps.values())
    assert trainer.history.losses == []


def test_eval_first_still_evaluates_once_with_eval_interval_zero(recipe, tmp_path):
    """llm-foundry's eval_first calls trainer.eval() itself, whatever eval_interval is."""
    path = tmp_path / "metrics.jsonl"
    trainer = make_trainer(recipe(max_duration="2ba", eval_interval=0, eval_first=True,
                                  loggers={"jsonl": {"path": str(path)}}))
    trainer.fit()
    assert [batch for batch, _ in trainer.history.losses] == [0]
    assert [step for step, row in logged_steps(path).items() if EVAL_KEY in row] == [0]


def test_eval_interval_in_dur_of_zero_stays_an_error(recipe):
    with pytest.raises(ConfigError, match="eval_interval: must be at least one batch, got '0dur'"):
        make_trainer(recipe(eval_interval="0dur"))


def test_run_name_in_save_folder_from_the_command_line_and_autoresume(recipe, tmp_path):
    """The llm-foundry habit save_folder=.../{run_name}/checkpoints: checkpoints land in the expanded folder, and
    a second run with the same run_name resumes from them."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(eval_loader=None, max_duration="2ba", save_interval="2ba")))
    save = f"save_folder={tmp_path}/{{run_name}}/checkpoints"
    assert cli(["train", str(path), save, "run_name=my-run", "eval_interval=0"]) == 0
    folder = tmp_path / "my-run" / "checkpoints"
    assert (folder / "latest").read_text().strip() == "ep0-ba2"
    assert not (tmp_path / "{run_name}").exists()

    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", save_interval="2ba", run_name="my-run",
                                  save_folder=f"{tmp_path}/{{run_name}}/checkpoints", autoresume=True))
    assert trainer.time.batch == 2 and trainer.cfg.save_folder == str(folder)
    trainer.fit()
    assert (folder / "latest").read_text().strip() == "ep0-ba4"


def cfg_of(recipe, **keys) -> TrainConfig:
    return validate(recipe(**keys), TrainConfig)


def test_the_run_name_comes_from_the_recipe_then_run_name_then_composer_run_name(recipe, monkeypatch):
    assert given_run_name(None, {}) is None
    assert given_run_name(None, {"COMPOSER_RUN_NAME": "c"}) == "c"
    assert given_run_name(None, {"RUN_NAME": "r", "COMPOSER_RUN_NAME": "c"}) == "r"
    assert given_run_name("mine", {"RUN_NAME": "r"}) == "mine"
    monkeypatch.setenv("RUN_NAME", "from-env")
    name, cfg = resolve_run_name(cfg_of(recipe, save_folder="runs/{run_name}/ckpt"))
    assert name == "from-env" and cfg.save_folder == "runs/from-env/ckpt"


def test_a_generated_run_name_is_used_when_none_is_given(recipe):
    name, cfg = resolve_run_name(cfg_of(recipe, save_folder="runs/{run_name}"))
    assert name.startswith("llmfoundry-") and cfg.save_folder == f"runs/{name}"


def test_run_name_expands_in_every_path_key_composer_expands(recipe):
    cfg = with_run_name(cfg_of(recipe, save_folder="s3://bucket/{run_name}/ckpt", load_path="old/{run_name}/ckpt",
                               callbacks={"hf_checkpointer": {"save_folder": "hf/{run_name}", "save_interval": "2ba"}},
                               loggers={"jsonl": {"path": "logs/{run_name}.jsonl"}}), "r1")
    assert cfg.save_folder == "s3://bucket/r1/ckpt" and cfg.load_path == "old/r1/ckpt"
    assert cfg.callbacks["hf_checkpointer"].save_folder == "hf/r1"
    assert cfg.loggers["jsonl"].path == "logs/r1.jsonl"


def test_expansion_leaves_the_validated_config_unchanged(recipe):
    cfg = cfg_of(recipe, save_folder="runs/{run_name}")
    assert with_run_name(cfg, "r1").save_folder == "runs/r1" and cfg.save_folder == "runs/{run_name}"


def test_composer_placeholders_other_than_run_name_are_a_one_line_error(recipe):
    with pytest.raises(ConfigError, match=r"save_folder: '\{rank\}' in 'runs/\{run_name\}/\{rank\}' is not expanded"):
        with_run_name(cfg_of(recipe, save_folder="runs/{run_name}/{rank}"), "r1")


def test_autoresume_under_a_generated_run_name_is_an_error(recipe):
    """Composer refuses autoresume without a run_name: with {run_name} in save_folder a restart could never find
    its checkpoints."""
    with pytest.raises(ConfigError, match="autoresume: save_folder 'runs/{run_name}' contains {run_name} but no "
                                          "run_name is set"):
        resolve_run_name(cfg_of(recipe, save_folder="runs/{run_name}", autoresume=True))
