"""Loading recipes: YAML, overrides (llm-foundry's OmegaConf dot-lists, plus Hydra's +, ++ and ~) and interpolation."""

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


def test_lists_and_numbers_parse_as_yaml(recipe):
    cfg = load_config(recipe, ["optimizer.betas=[0.9,0.95]", "optimizer.lr=6.0e-4"])
    assert cfg["optimizer"] == {"betas": [0.9, 0.95], "lr": 6.0e-4}


def test_malformed_override_is_a_one_line_error(recipe):
    with pytest.raises(ConfigError, match="override 'model.d_model=\\[1,': the value is not valid YAML") as error:
        load_config(recipe, ["model.d_model=[1,"])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("override, value", [
    ("max_duration=10ba", "10ba"),
    ("seed=3", 3),
    ("optimizer.lr=6.0e-4", 6.0e-4),
    ("optimizer.lr=1e-3", 1e-3),  # OmegaConf's YAML loader: a float, not the string '1e-3'
    ("x=[1,2]", [1, 2]),
    ("x=[a, b]", ["a", "b"]),
    ("x={a: 1, b: [2]}", {"a": 1, "b": [2]}),
    ("x=null", None),
    ("x=", None),
    ("x", None),  # a bare key sets None, as OmegaConf.from_cli does
    ("x=true", True),
    ("x=False", False),
    ("x='3'", "3"),
    ('x="a b"', "a b"),
    ("x=a b", "a b"),
    ("x=a=b", "a=b"),  # split at the first '='
    ("save_folder=s3://bucket/{run_name}/ckpt", "s3://bucket/{run_name}/ckpt"),
    ("save_folder='{run_name}/ckpt'", "{run_name}/ckpt"),
    ("save_folder=runs/{run_name}", "runs/{run_name}"),
    ("load_path=oci://b/p:v=1", "oci://b/p:v=1"),
    ("x=2024-01-01", "2024-01-01"),  # no timestamps: a string, as in llm-foundry
    ("x=${variables.width}", 64),
])
def test_override_values_are_read_as_llm_foundry_reads_them(recipe, override, value):
    """llm-foundry passes overrides to OmegaConf.from_cli: split at the first '=', the value read as YAML."""
    got = load_config(recipe, [override])
    for part in override.partition("=")[0].split("."):
        got = got[part]
    assert got == value and type(got) is type(value)


def test_nested_override_creates_the_sections_it_names(recipe):
    cfg = load_config(recipe, ["a.b.c=null", "model.attn_config.attn_impl=torch"])
    assert cfg["a"] == {"b": {"c": None}}
    assert cfg["model"]["attn_config"] == {"attn_impl": "torch"}


def test_a_mapping_override_merges_into_the_section(recipe):
    """llm-foundry merges the command line into the YAML: other keys of the section stay."""
    cfg = load_config(recipe, ["model={n_layers: 2, d_model: 32}"])
    assert cfg["model"] == {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 4, "n_layers": 2}


def test_null_replaces_a_whole_section(recipe):
    assert load_config(recipe, ["model=null"])["model"] is None


def test_list_items_are_addressed_by_index(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("icl_tasks:\n- label: a\n  num_fewshot: [0]\n- label: b\n  num_fewshot: [1]\n")
    cfg = load_config(path, ["icl_tasks.1.num_fewshot=[0,5]"])
    assert cfg["icl_tasks"] == [{"label": "a", "num_fewshot": [0]}, {"label": "b", "num_fewshot": [0, 5]}]


def test_later_overrides_win(recipe):
    assert load_config(recipe, ["seed=1", "seed=2"])["seed"] == 2


def test_llm_foundry_readme_overrides():
    """The overrides of llm-foundry's README quickstart, on our 125m recipe."""
    recipe = Path(__file__).resolve().parents[2] / "yamls" / "mpt" / "125m.yaml"
    overrides = ["variables.data_local=my-copy-c4", "train_loader.dataset.split=train_small",
                 "eval_loader.dataset.split=val_small", "max_duration=10ba", "eval_interval=0",
                 "save_folder=mpt-125m"]
    plain = load_config(recipe, overrides)
    assert plain["train_loader"]["dataset"]["local"] == "my-copy-c4"
    assert plain["train_loader"]["dataset"]["split"] == "train_small"
    assert plain["eval_loader"]["dataset"]["split"] == "val_small"
    assert (plain["max_duration"], plain["eval_interval"], plain["save_folder"]) == ("10ba", 0, "mpt-125m")
    cfg = validate(plain, TrainConfig)
    assert cfg.eval_interval == 0 and cfg.save_folder == "mpt-125m"


def test_llm_foundry_style_section_overrides(recipe):
    """Forms seen in llm-foundry launch scripts: a quoted flow mapping, an empty section, null."""
    cfg = load_config(recipe, ["optimizer={'name':'decoupled_lionw', 'lr':0.0001}", "loggers.wandb={}",
                               "fsdp_config=null", "run_name=my-run"])
    assert cfg["optimizer"] == {"name": "decoupled_lionw", "lr": 0.0001}
    assert cfg["loggers"] == {"wandb": {}}
    assert cfg["fsdp_config"] is None and cfg["run_name"] == "my-run"


def test_an_unquoted_value_starting_with_a_brace_says_how_to_quote_it(recipe):
    with pytest.raises(ConfigError, match=r"override 'save_folder=\{run_name\}/ckpt': the value is not valid YAML "
                                          r".*quote it, e\.g\. save_folder='\{run_name\}/ckpt'"):
        load_config(recipe, ["save_folder={run_name}/ckpt"])


@pytest.mark.parametrize("override", ["=5", "a..b=1", "+=1", "~", ".a=1"])
def test_an_override_without_a_key_is_a_one_line_error(recipe, override):
    with pytest.raises(ConfigError, match="is not a key"):
        load_config(recipe, [override])


def test_an_override_that_cannot_apply_names_itself(recipe):
    with pytest.raises(ConfigError, match="override 'optimizer.betas.first=0.8': .*") as error:
        load_config(recipe, ["optimizer.betas=[0.9,0.95]", "optimizer.betas.first=0.8"])
    assert "\n" not in str(error.value)


def test_tilde_with_a_value_deletes_only_that_value(recipe):
    assert "drop_me" not in load_config(recipe, ["~drop_me=1"])
    with pytest.raises(ConfigError, match="its value is 1, not 2"):
        load_config(recipe, ["~drop_me=2"])


def test_plus_prefixes_read_values_like_plain_overrides(recipe):
    cfg = load_config(recipe, ["+save_folder=s3://b/{run_name}", "++max_duration=10ba", "+model.n_layers=2"])
    assert cfg["save_folder"] == "s3://b/{run_name}" and cfg["max_duration"] == "10ba"
    assert cfg["model"]["n_layers"] == 2


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


@pytest.mark.parametrize("override", ["tokenizer.kwargs={model_max_length:64}", "x=[{a:1}]"])
def test_a_flow_mapping_without_a_space_after_the_colon_is_an_error(recipe, override):
    """YAML reads {a:1} as the key 'a:1' with no value; llm-foundry would take it so without a word."""
    with pytest.raises(ConfigError, match=r"reads as a key with no value; put a space after the colon"):
        load_config(recipe, [override])


def test_llm_foundry_top_level_variables_are_read_as_variables_and_near_misses_stay_errors(tmp_path, caplog):
    from llmfoundry.train.recipe import TrainConfig

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("data_local: ./c4\nglobal_seed: 5\ntokenizer_name: gpt2\nseed: ${global_seed}\n"
                      "tokenizer: {name: '${tokenizer_name}'}\nmax_duraton: 3ba\nrun_nam: x\n")
    with caplog.at_level("WARNING", logger="llmfoundry"):
        plain = load_config(recipe, [], TrainConfig)
    # read by an interpolation, or close to no key of the schema: a variable, said once
    assert plain["variables"] == {"data_local": "./c4", "global_seed": 5, "tokenizer_name": "gpt2"}
    assert plain["seed"] == 5 and plain["tokenizer"] == {"name": "gpt2"}
    assert "data_local, global_seed, tokenizer_name: read as variables" in caplog.text
    # near misses of real keys stay where the validator reports them with a suggestion
    assert plain["max_duraton"] == "3ba" and plain["run_nam"] == "x"
    # without a schema nothing moves
    assert "data_local" in load_config(recipe, [])
