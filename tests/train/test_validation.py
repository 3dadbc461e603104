"""Problems a training recipe can show before anything is built are reported by validation, all at once and named by
their key path; a loader's build-time problems are named by that loader's own key."""

from __future__ import annotations

import pytest
import yaml

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import TrainConfig, validate


def train(tmp_path, cfg: dict, *overrides: str) -> int:
    """`llmfoundry train RECIPE overrides...` in this process; returns the exit code."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return cli(["train", str(path), *overrides])


def problems_of(cfg: dict) -> list[str]:
    with pytest.raises(ConfigError) as error:
        validate(cfg, TrainConfig)
    return error.value.problems


def test_composer_model_surgery_is_refused_by_validation(recipe, tmp_path, capsys):
    assert train(tmp_path, recipe(), "+algorithms.low_precision_layernorm.apply_at_fit_start=true") == 2
    assert capsys.readouterr().err.strip() == (
        "error: algorithms.low_precision_layernorm: Composer's model surgery is not done here: remove it and, on "
        "mpt_causal_lm, set model.norm_type: low_precision_layernorm (an hf_causal_lm model cannot be changed: use "
        "mpt_causal_lm with that key)")


def test_fsdp_mixed_precision_mapping_keys_and_dtypes_are_checked_by_validation(recipe):
    mixed = {"param_dtype": "bf16", "reduce_dtpe": "fp32", "buffer_dtype": "fp8"}
    problems = problems_of(recipe(fsdp_config={"mixed_precision": mixed}))
    assert problems == [
        "fsdp_config.mixed_precision.reduce_dtpe: unknown key (use param_dtype, reduce_dtype, buffer_dtype)",
        "fsdp_config.mixed_precision.buffer_dtype: 'fp8' is not a dtype "
        "(use one of fp32, float32, bf16, bfloat16, fp16, float16)",
    ]
    long_names = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "bf16"}
    cfg = validate(recipe(fsdp_config={"mixed_precision": long_names}), TrainConfig)
    assert cfg.fsdp_config.mixed_precision == long_names


def test_problems_of_different_sections_are_reported_together(recipe, tmp_path, capsys):
    overrides = ["+algorithms.alibi.max_sequence_length=64", "+fsdp_config.mixed_precision.param_dtype=fp8",
                 "max_duration=0.5dur"]  # fmt: skip
    assert train(tmp_path, recipe(), *overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 3 problems in the config:")
    for key in ("algorithms.alibi: Composer's model surgery", "fsdp_config.mixed_precision.param_dtype: 'fp8'",
                "max_duration: cannot be given in dur"):
        assert key in err


@pytest.mark.parametrize("overrides, problem", [
    ({"autoresume": True}, "autoresume: needs save_folder (the folder to resume from)"),
    ({"eval_gauntlet": {"categories": []}}, "eval_gauntlet: needs icl_tasks"),
    ({"save_folder": "hf://org/run"}, "save_folder: 'hf://org/run': hf:// is read-only here"),
    ({"load_path": "s3:///run"}, "load_path: 's3:///run' has no bucket"),
    ({"callbacks": {"mono_checkpoint_saver": {"save_folder": "gs://bucket/mono", "batch_interval": 1}}},
     "callbacks.mono_checkpoint_saver.save_folder: 'gs://bucket/mono': gs:// object stores are not supported"),
    ({"callbacks": {"hf_checkpointer": {"save_folder": "hf", "huggingface_folder_name": "step{step}"}}},
     "callbacks.hf_checkpointer.huggingface_folder_name: '{step}' in 'step{step}' is not known"),
    ({"callbacks": {"hf_checkpointer": {"save_folder": "hf", "mlflow_registered_model_name": "m"}}},
     "callbacks.hf_checkpointer.mlflow_registered_model_name: "),
    ({"callbacks": {"hf_checkpointer": {"save_folder": "hf", "save_interval": "often"}}},
     "callbacks.hf_checkpointer.save_interval: 'often' is not a time"),
    ({"scheduler": {"name": "cosine_with_warmup", "t_warmup": "100"}}, "scheduler.t_warmup: '100' is not a time"),
])  # fmt: skip
def test_settings_that_cannot_work_are_refused_by_validation(recipe, overrides, problem):
    (found,) = problems_of(recipe(**overrides))
    assert found.startswith(problem), found


def test_hf_checkpointer_accepts_llm_foundrys_keys(recipe):
    hf = {"save_folder": "s3://bucket/{run_name}", "save_interval": "1dur", "precision": "bfloat16",
          "huggingface_folder_name": "{run_name}/ep{epoch}-ba{batch}", "overwrite": True,
          "final_register_only": False, "register_wait_seconds": 60, "flatten_imports": ["llmfoundry"]}
    cfg = validate(recipe(callbacks={"hf_checkpointer": hf}), TrainConfig)
    assert cfg.callbacks["hf_checkpointer"].huggingface_folder_name == "{run_name}/ep{epoch}-ba{batch}"


@pytest.mark.parametrize("setting", ["eval_loader.dataset.split=test", "eval_loader.dataset.local=/nonexistent/mds"])
def test_a_missing_eval_split_or_folder_is_reported_under_eval_loader(recipe, tmp_path, capsys, setting):
    assert train(tmp_path, recipe(max_duration="1ba"), setting) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: eval_loader.dataset.local: folder '") and "does not exist" in err, err
    assert "\n" not in err
