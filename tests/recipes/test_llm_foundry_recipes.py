"""llm-foundry's own train and eval recipes, as tiny local equivalents: the ones that validate train (or evaluate)
for 2 batches through ``llmfoundry train``/``eval``; the ones that do not are exactly the expected list below.

The recipes and every key/value they set are in tests/fixtures/llm_foundry_recipe_keys.json (read from
mosaicml/llm-foundry); tests/recipes/llm_foundry_keys.py builds the equivalents (``python -m
tests.recipes.llm_foundry_keys`` prints the table of problems). A run takes about a second on a 2-core CPU, so
none is marked slow (the whole file takes ~15 s); mark the slow ones if the file grows past ~60 s.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.recipes.llm_foundry_keys import (
    LocalData,
    check_all,
    kind_of,
    load_inventory,
    recipe_names,
    tiny_equivalent,
    unflatten,
    write_equivalent,
)

# Recipes whose tiny equivalent does not validate yet, and why. When a key starts to be accepted, the test below
# fails and asks for the recipe to be removed here (it then runs in test_tiny_equivalent_runs_two_batches).
EXPECTED_INVALID = {
    "scripts/eval/yamls/openai_eval.yaml": "models openai_chat / openai_causal_lm (hosted API clients): one-line error",
    "scripts/train/yamls/pretrain/mpt-350m.yaml": "attn_impl triton (removed from llm-foundry in 0.7)",
    "scripts/train/yamls/pretrain/mpt-3b.yaml": "attn_impl triton (removed from llm-foundry in 0.7)",
    "scripts/train/yamls/pretrain/mpt-70b.yaml": "attn_impl triton (removed from llm-foundry in 0.7)",
    "scripts/train/yamls/pretrain/mpt-7b.yaml": "attn_impl triton (removed from llm-foundry in 0.7)",
}  # fmt: skip

# Recipes that validate but cannot run on this machine: the one-line error each must end with (exit code 2).
EXPECTED_RUN_ERRORS = {
    "scripts/eval/yamls/hf_8bit_eval.yaml": "model.load_in_8bit: needs a CUDA GPU",
    # use_flash_attention_2 needs the flash-attn package (and a GPU); their finetuning eos_token_id is accepted
    "scripts/train/yamls/finetune/dbrx-full-ft.yaml": "model.use_flash_attention_2: 'flash_attention_2' cannot be used",
    "scripts/train/yamls/finetune/dbrx-lora-ft.yaml": "model.use_flash_attention_2: 'flash_attention_2' cannot be used",
    # packing_ratio 9 with drop_last leaves the tiny eval split no full batch: said in one line, not a loss of 0
    "scripts/train/yamls/finetune/mpt-30b-instruct.yaml": "eval_loader: the evaluation data gave no token to score",
}

VALID = [name for name in recipe_names() if name not in EXPECTED_INVALID]


def _param(name: str):
    short = name.replace("scripts/train/yamls/", "").replace("scripts/eval/yamls/", "eval/")
    return pytest.param(name, id=short)


@pytest.fixture(scope="module")
def local_data(tmp_path_factory, tokenizer_dir, mds_root) -> LocalData:
    return LocalData(tmp_path_factory.mktemp("llm-foundry-equivalents"), tokenizer_dir, mds_root)


def _flat(value, prefix="", out=None) -> dict:
    out = {} if out is None else out
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            _flat(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


def test_inventory_holds_llm_foundry_pretrain_finetune_and_eval_recipes_with_their_commits():
    inventory = load_inventory()
    recipes, commits = inventory["recipes"], inventory["commits"]
    assert inventory["repository"] == "mosaicml/llm-foundry"
    assert set(commits) == set(recipes)
    assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in commits.values())
    for folder in ("scripts/train/yamls/pretrain/", "scripts/train/yamls/finetune/", "scripts/eval/yamls/"):
        assert sum(name.startswith(folder) for name in recipes) >= 6, folder
    assert all(len(keys) >= 5 for keys in recipes.values())
    # the flattened key paths rebuild each recipe without loss
    for keys in recipes.values():
        assert _flat(unflatten(keys)) == keys


# The keys whose values the tiny equivalents change (size, data, paths: see tests/recipes/llm_foundry_keys.py)
SHRUNK = {"d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size", "icl_seq_len", "icl_max_seq_len",
          "pretrained_model_name_or_path", "pretrained_lora_id_or_path", "local", "remote", "split", "hf_name",
          "data_dir", "preprocessing_fn", "dataset_uri", "load_path", "save_folder", "max_duration", "eval_interval",
          "save_interval", "global_train_batch_size", "device_train_microbatch_size", "device_eval_batch_size",
          "icl_tasks", "eval_gauntlet", "tokenizer_name", "model_name", "model_name_or_path", "num_workers", "persistent_workers",
          "prefetch_factor"}  # fmt: skip


def test_tiny_equivalents_keep_every_key_and_value_of_the_llm_foundry_recipe(local_data, tmp_path):
    for name, keys in load_inventory()["recipes"].items():
        tiny = _flat(tiny_equivalent(name, local_data, tmp_path))
        missing = [k for k in keys if k not in tiny and not any(t.startswith(k + ".") for t in tiny)]
        assert not missing, f"{name}: the tiny equivalent drops {missing}"
        changed = {k: (v, tiny[k]) for k, v in keys.items()
                   if k in tiny and tiny[k] != v and re.split(r"[.\[]", k)[-1] not in SHRUNK
                   and not k.endswith("tokenizer.name")}  # fmt: skip
        assert not changed, f"{name}: the tiny equivalent changes {changed}"


def test_recipes_failing_validation_are_exactly_the_expected_ones(local_data, tmp_path):
    results = check_all(local_data, tmp_path)
    failing = {name for name, problems in results.items() if problems}
    newly_failing = {name: results[name] for name in sorted(failing - set(EXPECTED_INVALID))}
    now_valid = sorted(set(EXPECTED_INVALID) - failing)
    assert not newly_failing, "these llm-foundry recipes no longer validate:\n" + json.dumps(newly_failing, indent=1)
    assert not now_valid, f"these recipes validate now: remove them from EXPECTED_INVALID: {now_valid}"


@pytest.mark.parametrize("recipe", [_param(name) for name in VALID])
def test_tiny_equivalent_runs_two_batches(recipe, local_data, tmp_path, monkeypatch, capsys):
    from llmfoundry import cli

    kind = kind_of(unflatten(load_inventory()["recipes"][recipe]))
    path = write_equivalent(recipe, local_data, tmp_path / "recipe")
    monkeypatch.chdir(tmp_path)  # eval writes eval_results.json to the working folder
    code = cli.main([kind, str(path)])
    if recipe in EXPECTED_RUN_ERRORS:
        assert code == 2 and EXPECTED_RUN_ERRORS[recipe] in capsys.readouterr().err
        return
    assert code == 0, f"llmfoundry {kind} {path.name} exited {code}: {capsys.readouterr().err[-2000:]}"
    if kind == "train":
        assert "[batch 2/2]" in capsys.readouterr().out
    else:
        assert (tmp_path / "eval_results.json").is_file()
