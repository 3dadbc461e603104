"""Every shipped recipe loads, validates, builds and runs on a CPU once shrunk to a tiny size.

One test per YAML file under yamls/ and eval/yamls/. Training recipes get tiny overrides (model width/depth,
data paths to generated tiny data, 2 batches) given in the same Hydra grammar a user types, then build every
component and run the steps. Eval recipes score tiny models on their tasks (one batch per task); task lists and
gauntlets load through the eval loaders. Nothing is downloaded: Hub model ids and datasets are replaced by the
tiny local stand-ins of tests/recipes/conftest.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.recipes.helpers import (
    MDS_SEQ,
    REPO,
    TINY_EXPERT_PARALLEL,
    TINY_FFN_HIDDEN,
    TINY_KV_HEADS,
    TINY_MPT,
    TINY_SEQ,
)

RECIPES = sorted(
    p.relative_to(REPO).as_posix()
    for pattern in ("yamls/**/*.yaml", "eval/yamls/**/*.yaml")
    for p in REPO.glob(pattern)
)


TINY_TASK_FILES = REPO / "eval" / "local_data_tiny"


def stand_in(task) -> str:
    """A tiny task file of the same type (and shape) as ``task``'s, for task files the repository does not ship."""
    kind = task.icl_task_type
    if kind == "language_modeling":
        name = "tiny_sequences_lm_cat.jsonl" if task.has_categories else "tiny_counting_lm.jsonl"
    elif kind == "generation_task_with_answers":
        name = "tiny_addition_cot.jsonl" if task.cot_delimiter else "tiny_multiplication_qa.jsonl"
    else:
        name = {"multiple_choice": "tiny_arithmetic_mc.jsonl", "schema": "tiny_schema.jsonl"}[kind]
    return str(TINY_TASK_FILES / name)


def kind_of(raw: dict) -> str:
    if "models" in raw:
        return "eval"
    if "model" in raw and "train_loader" in raw:
        return "train"
    if "icl_tasks" in raw:
        return "tasks"
    if "eval_gauntlet" in raw or "categories" in raw:
        return "gauntlet"
    raise AssertionError(f"unrecognised recipe shape (keys: {sorted(raw)})")


def test_every_recipe_directory_is_covered():
    names = set(RECIPES)
    assert {f"yamls/mpt/{size}.yaml" for size in ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")} <= names
    assert any(n.startswith("yamls/finetune/") for n in names)
    assert any(n.startswith("yamls/eval/") for n in names)


@pytest.fixture
def in_repo(monkeypatch):
    """Recipes name their local files relative to the repository root, as a user running them from it would."""
    monkeypatch.chdir(REPO)


def _loader_overrides(key: str, section: dict, split: str, recipe: str, mds_root: Path) -> list[str]:
    ds = f"{key}.dataset"
    common = [f"{key}.num_workers=0"]
    if section["name"] == "text":
        return common + [f"{ds}.max_seq_len={MDS_SEQ}"] + [f"{ds}.local='{mds_root}'", f"{ds}.remote=null", f"{ds}.split={split}"]
    dataset = section["dataset"]
    common.append(f"{ds}.max_seq_len={TINY_SEQ}")
    if dataset.get("hf_name") == "json":  # already local JSONL: keep the recipe's own files
        return common
    kind = "chat" if "chat" in Path(recipe).stem else "instruct"
    data_file = REPO / "yamls/finetune/data" / f"{kind}_{'train' if split == 'train' else 'val'}.jsonl"
    return common + [f"{ds}.hf_name=json", f"{ds}.split=train", f"{ds}.hf_kwargs={{data_files: '{data_file}'}}"]


def train_overrides(recipe: str, raw: dict, tmp_path: Path, fixtures: dict) -> list[str]:
    """Hydra-grammar overrides that shrink a training recipe to seconds on a CPU."""
    out = [
        f"max_seq_len={TINY_SEQ}", "max_duration=2ba", "eval_interval=2ba", "eval_subset_num_batches=1",
        "global_train_batch_size=4", "device_train_microbatch_size=2", "device_eval_batch_size=4",
        "precision=fp32", "progress_bar=false", "log_to_console=false", f"save_folder='{tmp_path / 'run'}'",
        "save_interval=2ba", "autoresume=false", f"tokenizer.name='{fixtures['tokenizer_dir']}'",
        f"tokenizer.kwargs={{model_max_length: {TINY_SEQ}}}",
    ]
    if set((raw.get("tokenizer") or {}).get("kwargs") or {}) - {"model_max_length"}:  # e.g. tiktoken's encoding_name
        out.insert(out.index(f"tokenizer.kwargs={{model_max_length: {TINY_SEQ}}}"), "~tokenizer.kwargs")
    if "prepare_data" in raw:  # the quickstart builds its data from the stdlib; the tests bring their own
        out.append("~prepare_data")
    if "loggers" in raw:
        out.append("~loggers")
    model = raw["model"]
    if model["name"] == "mpt_causal_lm":
        out += [f"model.{k}={v}" for k, v in TINY_MPT.items()]
        if (model.get("ffn_config") or {}).get("ffn_hidden_size") is not None:  # MoE recipes: width per expert
            out.append(f"model.ffn_config.ffn_hidden_size={TINY_FFN_HIDDEN}")
        if "kv_n_heads" in (model.get("attn_config") or {}):
            out.append(f"model.attn_config.kv_n_heads={TINY_KV_HEADS}")
        if (model.get("ffn_config") or {}).get("moe_world_size", 1) > 1:  # expert parallelism: over 2 ranks
            out.append(f"model.ffn_config.moe_world_size={TINY_EXPERT_PARALLEL}")
        if "mbmoe_tok_per_expert" in (raw.get("callbacks") or {}):  # log on the last of the 2 batches
            out.append("callbacks.mbmoe_tok_per_expert.log_interval=2")
    elif model["name"] == "hf_causal_lm":
        if model.get("pretrained", True):
            source = str(model["pretrained_model_name_or_path"]).lower()
            folder = fixtures["llama_hf_folder"] if "llama" in source else fixtures["mpt_hf_folder"]
            out.append(f"model.pretrained_model_name_or_path='{folder}'")
        else:  # built from the recipe's own config.json: shrink it
            tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": TINY_SEQ}
            out += [f"model.config_overrides.{k}={v}" for k, v in tiny.items()]
    if raw.get("load_path"):
        out.append(f"load_path='{fixtures['tiny_checkpoint']}'")
    for key, split in (("train_loader", "train"), ("eval_loader", "val")):
        if raw.get(key):
            out += _loader_overrides(key, raw[key], split, recipe, fixtures["mds_root"])
    return out


@pytest.fixture
def fixtures(request):
    names = ("tokenizer_dir", "mds_root", "mpt_hf_folder", "llama_hf_folder", "tiny_checkpoint")
    return {name: _Lazy(request, name) for name in names}


class _Lazy:
    """A session fixture requested only when a recipe needs it (so one recipe's test builds only what it uses)."""

    def __init__(self, request, name):
        self.request, self.name = request, name

    def __str__(self):
        return str(self.request.getfixturevalue(self.name))

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def run_train_recipe(recipe: str, tmp_path: Path, fixtures: dict) -> dict:
    from llmfoundry.config.load import load_config
    from llmfoundry.core import dist
    from llmfoundry.train.recipe import TrainConfig, validate
    from llmfoundry.train.trainer import Trainer

    raw = load_config(recipe)  # as shipped: must validate before any override
    shipped = validate(raw, TrainConfig)
    overrides = train_overrides(recipe, raw, tmp_path, fixtures)
    plain = load_config(recipe, overrides)
    cfg = validate(plain, TrainConfig)
    # The overrides shrank this recipe (a key they miss would leave the full-size model or data in place) and
    # changed nothing else: the same model and loaders as shipped.
    assert (cfg.max_seq_len, cfg.max_duration, cfg.global_train_batch_size) == (TINY_SEQ, "2ba", 4)
    assert cfg.tokenizer.name == str(fixtures["tokenizer_dir"])
    assert cfg.model.name == shipped.model.name and cfg.train_loader.name == shipped.train_loader.name
    if cfg.model.name == "mpt_causal_lm":
        assert {key: getattr(cfg.model.settings, key) for key in TINY_MPT} == TINY_MPT
        ffn, shipped_ffn = cfg.model.settings.ffn_config, shipped.model.settings.ffn_config
        # a mixture of experts stays one (same type, experts and top-k), only narrower
        assert (ffn.ffn_type, ffn.moe_num_experts, ffn.moe_top_k, ffn.mlp_type) == (
            shipped_ffn.ffn_type, shipped_ffn.moe_num_experts, shipped_ffn.moe_top_k, shipped_ffn.mlp_type)
        assert shipped_ffn.ffn_hidden_size is None or ffn.ffn_hidden_size == TINY_FFN_HIDDEN
    if cfg.train_loader.name == "text":
        assert cfg.train_loader.settings.dataset.local == str(fixtures["mds_root"])
    if cfg.tp_config is not None and cfg.tp_config.tensor_parallel_degree > 1:  # one TP group: that many ranks
        return run_under_torchrun(recipe, overrides, cfg.tp_config.tensor_parallel_degree, tmp_path)
    if cfg.model.name == "mpt_causal_lm" and cfg.model.settings.ffn_config.moe_world_size > 1:
        return run_under_torchrun(recipe, overrides, TINY_EXPERT_PARALLEL, tmp_path)
    try:
        metrics = Trainer(cfg, plain).fit()
    finally:
        dist.destroy()
    return metrics


def run_under_torchrun(recipe: str, overrides: list[str], nproc: int, tmp_path: Path) -> dict:
    """``llmfoundry train -n nproc`` on the shrunk recipe; the metrics rank 0 logged, later rows winning."""
    import json
    import subprocess
    import sys

    from tests.distributed.helpers import worker_env

    log = tmp_path / "metrics.jsonl"
    command = [sys.executable, "-m", "llmfoundry.cli", "train", "-n", str(nproc), recipe, *overrides,
               f"+loggers.jsonl.path='{log}'"]
    result = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = {p.name for p in (tmp_path / "run").glob("*/rank*.pt")}
    assert ranks == {f"rank{r}.pt" for r in range(nproc)}, f"not a {nproc}-rank run: {ranks}"
    metrics: dict = {}
    for line in log.read_text().splitlines():
        metrics.update(json.loads(line))
    return metrics


def _tiny_eval_models(models: list[dict], fixtures: dict) -> list[dict]:
    tiny = []
    for spec in models:
        spec = dict(spec)
        model = dict(spec.get("model") or {})
        if spec.get("load_path"):
            spec["load_path"] = str(fixtures["tiny_checkpoint"])
        elif model.get("name", "hf_causal_lm") == "hf_causal_lm":
            source = str(model.get("pretrained_model_name_or_path", "")).lower()
            model["pretrained_model_name_or_path"] = str(
                fixtures["llama_hf_folder"] if "llama" in source else fixtures["mpt_hf_folder"]
            )
            spec["model"] = model
            spec["tokenizer"] = {}
        else:
            model.update(TINY_MPT)
            spec["model"] = model
            spec["tokenizer"] = {"name": str(fixtures["tokenizer_dir"])}
        tiny.append(spec)
    return tiny


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_builds_and_runs_tiny(recipe, tmp_path, in_repo, fixtures):
    raw = yaml.safe_load((REPO / recipe).read_text())
    kind = kind_of(raw)
    if kind == "train":
        metrics = run_train_recipe(recipe, tmp_path, fixtures)
        assert math.isfinite(metrics["loss/train/total"])
        assert any(k.startswith("loss/eval") or k.startswith("metrics/eval") for k in metrics) or not raw.get(
            "eval_loader"
        )
        assert any((tmp_path / "run").iterdir()), "the run saved no checkpoint"
        from llmfoundry.models.layers.moe_keys import MOE_TYPES

        if (raw["model"].get("ffn_config") or {}).get("ffn_type") in MOE_TYPES:  # the experts ran, and were counted
            assert math.isfinite(metrics["loss/train/lbl"]) and metrics["loss/train/lbl"] > 0
            if "mbmoe_tok_per_expert" in (raw.get("callbacks") or {}):
                assert metrics["mb_moe/all_layers_max_tpe"] > 0
    elif kind == "eval":
        from llmfoundry.commands.eval_run import run_eval
        from llmfoundry.config.load import load_config
        from llmfoundry.eval.config import load_eval_config

        # values a user must give on the command line (`???`) get a stand-in; the models are replaced below anyway
        required = [k for k, v in (raw.get("variables") or {}).items() if v == "???"]
        plain = load_config(recipe, [f"variables.{k}='{fixtures['tiny_checkpoint']}'" for k in required])
        load_eval_config(dict(plain))  # as shipped
        plain.update(models=_tiny_eval_models(plain["models"], fixtures), max_seq_len=TINY_SEQ,
                     device_eval_batch_size=4, icl_subset_num_batches=1, results_path=str(tmp_path / "results.json"),
                     table_path=str(tmp_path / "table.md"), plot_path=None)  # fmt: skip
        results = run_eval(load_eval_config(plain))
        assert set(results) == {m["model_name"] for m in plain["models"]}
        for result in results.values():
            assert result["metrics"], "no task produced a metric"
            if plain.get("eval_gauntlet"):
                assert result["gauntlet"], "the gauntlet produced no score"
        assert (tmp_path / "results.json").is_file()
    elif kind == "tasks":
        import dataclasses

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llmfoundry.eval.config import load_icl_tasks
        from llmfoundry.eval.runner import ICLEvaluator

        tasks = load_icl_tasks(recipe)
        assert tasks
        # Task files that are not shipped (e.g. eval/local_data/, built by the user) are stood in for by a tiny
        # file of the same task type, so every task's own settings (delimiters, shots, categories) still run.
        runnable = [t if Path(t.dataset_uri).is_file() else dataclasses.replace(t, dataset_uri=stand_in(t))
                    for t in tasks if "://" not in t.dataset_uri]  # fmt: skip
        assert runnable, f"every task of {recipe} is remote: none could run"
        folder = str(fixtures["mpt_hf_folder"])
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        evaluator = ICLEvaluator(runnable, tokenizer, batch_size=4, max_seq_len=TINY_SEQ, subset_num_batches=1)
        metrics = evaluator.evaluate(model, torch.device("cpu"))
        for task in runnable:
            assert any(k.startswith(task.label) or f"/{task.label}/" in k for k in metrics), f"no metric for {task.label}"
    else:
        from llmfoundry.eval.config import load_gauntlet, load_icl_tasks

        gauntlet = load_gauntlet(recipe)
        assert gauntlet.categories
        # every benchmark names a task (and one of its shot counts) of a task list shipped beside it
        shots: dict[str, set[int]] = {}
        for other in (REPO / recipe).parent.glob("*.yaml"):
            data = yaml.safe_load(other.read_text()) or {}
            if isinstance(data.get("icl_tasks"), list) and "models" not in data:
                for task in load_icl_tasks(str(other.relative_to(REPO))):
                    shots.setdefault(task.label, set()).update(task.num_fewshot)
        assert shots, f"no task list ships beside {recipe}"
        for category in gauntlet.categories:
            for bench in category.benchmarks:
                assert bench.num_fewshot in shots.get(bench.name, set()), f"{category.name}: {bench.name}"


def test_chat_local_continues_from_the_quickstart_architecture():
    """chat-local loads the quickstart checkpoint's weights, so its model must have the same shape."""
    quick = yaml.safe_load((REPO / "yamls/quickstart.yaml").read_text())["model"]
    chat = yaml.safe_load((REPO / "yamls/finetune/chat-local.yaml").read_text())["model"]
    for key in ("name", "d_model", "n_heads", "n_layers", "expansion_ratio", "vocab_size", "learned_pos_emb"):
        assert chat.get(key) == quick.get(key), key
    assert chat["attn_config"]["alibi"] == quick["attn_config"]["alibi"]
