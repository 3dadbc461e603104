"""Loader settings are checked when the recipe is validated: every problem at once, under the loader's own key,
before any data is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfoundry.cli import main as cli_main
from llmfoundry.config.load import load_config
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import FinetuningLoaderSettings, TextLoaderSettings
from llmfoundry.train.recipe import TrainConfig, validate

YAMLS = Path(__file__).resolve().parents[2] / "yamls"
QUICKSTART = YAMLS / "quickstart.yaml"
INSTRUCT = YAMLS / "finetune" / "instruct-local.yaml"


def recipe_problems(recipe: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate(load_config(recipe, overrides), TrainConfig)
    return caught.value.problems


def loader_problems(settings: dict, cls: type, key: str = "train_loader") -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate(settings, cls, key)
    return caught.value.problems


def test_text_loader_problems_are_all_reported_under_each_loaders_key():
    problems = recipe_problems(QUICKSTART, ["eval_loader.num_workers=-1", "eval_loader.dataset.max_seq_len=0",
                                            "train_loader.persistent_workers=true"])
    assert sorted(problems) == [
        "eval_loader.dataset.max_seq_len: must be positive, got 0",
        "eval_loader.num_workers: expected >= 0, got -1",
        "train_loader.persistent_workers: needs num_workers > 0 (it is 0)",
    ]


def test_finetuning_loader_problems_are_reported_by_validation():
    problems = recipe_problems(INSTRUCT, ["train_loader.dataset.max_seq_len=-5", "+eval_loader.num_workers=-2"])
    assert sorted(problems) == [
        "eval_loader.num_workers: expected >= 0, got -2",
        "train_loader.dataset.max_seq_len: must be positive, got -5",
    ]


def test_the_train_command_exits_with_code_2_before_building_anything(capsys):
    assert cli_main(["train", str(QUICKSTART), "eval_loader.num_workers=-1"]) == 2
    assert "eval_loader.num_workers: expected >= 0, got -1" in capsys.readouterr().err


@pytest.mark.parametrize("cls", [TextLoaderSettings, FinetuningLoaderSettings])
def test_prefetch_factor_and_persistent_workers_need_worker_processes(cls):
    dataset = {"local": "data/mds"}
    assert loader_problems({"dataset": dataset, "prefetch_factor": 2, "persistent_workers": True}, cls) == [
        "train_loader.prefetch_factor: needs num_workers > 0 (it is 0)",
        "train_loader.persistent_workers: needs num_workers > 0 (it is 0)",
    ]
    settings = validate({"dataset": dataset, "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}, cls)
    assert settings.num_workers == 2


def test_text_dataset_settings_that_contradict_each_other():
    problems = loader_problems({"dataset": {"local": "a", "streams": {"b": {"local": "b"}}, "eos_token_id": 0,
                                            "bos_token_id": 1}}, TextLoaderSettings, "eval_loader")
    assert problems == ["eval_loader.dataset: set either streams or remote/local, not both",
                        "eval_loader.dataset: set eos_token_id or bos_token_id, not both"]


@pytest.mark.parametrize(("dataset", "problem"), [
    ({"hf_name": "json", "local": "mds"}, "train_loader.dataset: set hf_name or remote/local/streams, not both"),
    ({"hf_name": "json", "target_prompts": "sometimes"},
     "train_loader.dataset.target_prompts: expected none, all or length>=N, got 'sometimes'"),
    ({"hf_name": "json", "packing_ratio": 0.5}, "train_loader.dataset.packing_ratio: expected >= 1 (examples per "
                                                 "row), got 0.5"),
    ({"local": "mds", "packing_ratio": "auto"},
     "train_loader.dataset.packing_ratio: 'auto' needs hf_name data; set a number for MDS data"),
    ({"hf_name": "json", "packing_ratio": 2, "decoder_only_format": False},
     "train_loader.dataset.packing_ratio: packing needs decoder_only_format: true"),
    ({"hf_name": "json", "decoder_only_format": False, "target_responses": "all"},
     "train_loader.dataset.decoder_only_format: false makes the last response the labels; leave target_prompts none "
     "and target_responses last"),
])  # fmt: skip
def test_finetuning_dataset_settings_that_contradict_each_other(dataset, problem):
    assert loader_problems({"dataset": dataset}, FinetuningLoaderSettings) == [problem]


def test_valid_finetuning_settings_pass():
    settings = validate({"dataset": {"hf_name": "json", "target_prompts": "length>=8", "packing_ratio": "auto"}},
                        FinetuningLoaderSettings, "train_loader")
    assert settings.dataset.packing_ratio == "auto" and settings.dataset.target_prompts == "length>=8"
