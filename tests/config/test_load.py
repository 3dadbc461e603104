"""Loading recipes: YAML, Hydra-grammar overrides and interpolation."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfoundry.config.load import load_config
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import TrainConfig, validate

RECIPE = """\
variables:
  width: 64
  seed: 3
seed: ${variables.seed}
model:
  name: mpt_causal_lm
  d_model: ${variables.width}
  n_heads: 4
drop_me: 1
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return path


def test_interpolation_resolves_variables(recipe):
    cfg = load_config(recipe)
    assert cfg["model"]["d_model"] == 64
    assert cfg["seed"] == 3


def test_override_of_a_variable_flows_through_interpolation(recipe):
    cfg = load_config(recipe, ["variables.width=128"])
    assert cfg["model"]["d_model"] == 128


def test_override_can_set_a_key_the_yaml_does_not_mention(recipe):
    cfg = load_config(recipe, ["model.attn_config.alibi=true", "max_duration=10ba"])
    assert cfg["model"]["attn_config"] == {"alibi": True}
    assert cfg["max_duration"] == "10ba"


def test_plus_and_double_plus_prefixes_add_keys(recipe):
    cfg = load_config(recipe, ["+new_key=2", "++model.n_heads=8", "+save_folder=s3://bucket/run"])
    assert cfg["new_key"] == 2
    assert cfg["model"]["n_heads"] == 8
    assert cfg["save_folder"] == "s3://bucket/run"


def test_tilde_deletes_a_key(recipe):
    cfg = load_config(recipe, ["~drop_me"])
    assert "drop_me" not in cfg


def test_deleting_a_missing_key_is_an_error(recipe):
    with pytest.raises(ConfigError, match="cannot delete 'nope'"):
        load_config(recipe, ["~nope"])


def test_lists_and_numbers_parse_like_hydra(recipe):
    cfg = load_config(recipe, ["optimizer.betas=[0.9,0.95]", "optimizer.lr=6.0e-4"])
    assert cfg["optimizer"] == {"betas": [0.9, 0.95], "lr": 6.0e-4}


def test_malformed_override_is_a_one_line_error(recipe):
    with pytest.raises(ConfigError, match="override 'model.d_model=\\[1,'"):
        load_config(recipe, ["model.d_model=[1,"])


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such recipe file"):
        load_config(tmp_path / "absent.yaml")


def test_invalid_yaml_reports_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+:\d+: invalid YAML"):
        load_config(path)


def test_unresolvable_interpolation_names_the_key(recipe):
    with pytest.raises(ConfigError, match="cannot resolve interpolation"):
        load_config(recipe, ["model.n_layers=${variables.missing}"])


def test_values_out_of_range_are_all_reported_before_anything_is_built():
    """The quickstart recipe with several impossible values: one error listing each key, raised by validation."""
    recipe = Path(__file__).resolve().parents[2] / "yamls" / "quickstart.yaml"
    overrides = ["optimizer.lr=-1", "optimizer.betas=[0.9,1.5]", "scheduler.alpha_f=-2", "max_seq_len=0",
                 "python_log_level=bogus", "device_train_microbatch_size=0", "model.d_model=130"]  # fmt: skip
    with pytest.raises(ConfigError) as error:
        validate(load_config(recipe, overrides), TrainConfig)
    message = str(error.value)
    for key in ("optimizer.lr", "optimizer.betas", "scheduler.alpha_f", "max_seq_len:", "python_log_level",
                "device_train_microbatch_size", "model.d_model: 130 is not divisible by model.n_heads=4"):
        assert key in message, key
