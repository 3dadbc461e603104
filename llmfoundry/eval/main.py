"""`llmfoundry eval RECIPE.yaml [overrides]`: score models on ICL tasks and the gauntlet.

The recipe has llm-foundry's eval shape (``models`` list, ``icl_tasks``, ``eval_gauntlet``, ``max_seq_len``,
``device_eval_batch_size``, ``precision``, ...; see llmfoundry.eval.config.EvalConfig). Each model is a Hugging
Face folder (``load_path`` or ``model.pretrained_model_name_or_path``) or one of our training checkpoints
(``load_path``). Prints a markdown table per model and the gauntlet table, writes ``results_path`` (JSON) and,
with ``plot_path``, a bar chart. Under torchrun the examples are split across ranks.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from llmfoundry.config.errors import ConfigError
from llmfoundry.eval.config import EvalConfig, EvalModelConfig, load_eval_config
from llmfoundry.eval.gauntlet import (
    compute_gauntlet,
    gauntlet_table,
    plot_gauntlet,
    plot_task_accuracies,
    tasks_table,
)
from llmfoundry.eval.icl.data import check_task_files
from llmfoundry.eval.runner import ICLEvaluator

log = logging.getLogger("llmfoundry.eval")


def read_config(path: str, overrides: list[str]) -> EvalConfig:
    """The validated recipe (YAML + Hydra-grammar overrides + interpolation, then the schema)."""
    from llmfoundry.config.load import load_config

    return load_eval_config(load_config(path, overrides))


def _is_hf_folder(path: str) -> bool:
    return (Path(path) / "config.json").is_file()


def _tokenizer_for(spec: EvalModelConfig, default_dir: str | None):
    if spec.tokenizer.get("name"):
        from llmfoundry.data.tokenizers import build_tokenizer

        return build_tokenizer(spec.tokenizer["name"], spec.tokenizer.get("kwargs") or {})
    if default_dir is None:
        raise ConfigError(f"models.{spec.model_name}.tokenizer.name: give the tokenizer (folder or hub id)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_dir)


def load_model(spec: EvalModelConfig, device: torch.device):
    """(model, tokenizer) for one entry of ``models``."""
    from transformers import AutoModelForCausalLM

    key = f"models.{spec.model_name}"
    name = spec.model.get("name")
    hf_path = spec.model.get("pretrained_model_name_or_path")
    if spec.load_path and _is_hf_folder(spec.load_path):
        hf_path, name = spec.load_path, "hf_causal_lm"
    elif spec.load_path:  # one of our training checkpoints
        try:
            from llmfoundry.train.checkpoint import load_model_for_inference
        except ImportError as error:
            raise ConfigError(f"{key}.load_path: loading training checkpoints is not available ({error})") from None
        model, tokenizer = load_model_for_inference(spec.load_path, device=device)
        if spec.tokenizer.get("name"):
            tokenizer = _tokenizer_for(spec, None)
        return model, tokenizer
    if name in (None, "hf_causal_lm"):
        if not hf_path:
            raise ConfigError(f"{key}: give load_path or model.pretrained_model_name_or_path")
        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if spec.model.get("trust_remote_code"):
            kwargs["trust_remote_code"] = True
        try:
            model = AutoModelForCausalLM.from_pretrained(hf_path, **kwargs)
        except OSError as error:
            raise ConfigError(f"{key}: cannot load a Hugging Face model from '{hf_path}': {error}") from None
        return model.to(device), _tokenizer_for(spec, hf_path)
    # any other registered model (random weights unless load_path)
    from llmfoundry import registry
    from llmfoundry.config.validate import validate

    entry = registry.models.get(name, key=f"{key}.model.name")
    settings = {k: v for k, v in spec.model.items() if k != "name"}
    if entry.config is not None:
        settings = validate(settings, entry.config, f"{key}.model")
    tokenizer = _tokenizer_for(spec, None)
    return entry.builder(settings, tokenizer).to(device), tokenizer


def run_eval(cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """Evaluate every model; returns ``{model_name: {"metrics": ..., "gauntlet": ...}}`` (printed on rank 0)."""
    from llmfoundry.train.dist import init_distributed

    check_task_files(cfg.icl_tasks)  # a missing task file shows before any model is loaded
    info = init_distributed(cfg.dist_timeout)
    torch.manual_seed(cfg.seed)
    results: dict[str, dict[str, Any]] = {}
    printed: list[str] = []
    for spec in cfg.models:
        start = time.perf_counter()
        model, tokenizer = load_model(spec, info.device)
        if cfg.precision == "bf16":
            model = model.to(torch.bfloat16)
        evaluator = ICLEvaluator(
            cfg.icl_tasks,
            tokenizer,
            batch_size=cfg.device_eval_batch_size,
            max_seq_len=cfg.max_seq_len,
            precision=cfg.precision,
            subset_num_batches=cfg.icl_subset_num_batches,
            verbose=True,
        )
        metrics = evaluator.evaluate(model, info.device)
        gauntlet = (
            compute_gauntlet(metrics, cfg.eval_gauntlet, evaluator.sample_counts()) if cfg.eval_gauntlet else {}
        )
        results[spec.model_name] = {
            "metrics": metrics,
            "gauntlet": gauntlet,
            "sample_counts": evaluator.sample_counts(),
            "seconds": round(time.perf_counter() - start, 2),
        }
        if info.is_main:
            table = f"## {spec.model_name}\n\n{tasks_table(metrics)}\n"
            print(table, flush=True)
            printed.append(table)
        del model
    if info.is_main:
        if cfg.eval_gauntlet:
            table = "## gauntlet\n\n" + gauntlet_table({m: r["gauntlet"] for m, r in results.items()}) + "\n"
            print(table, flush=True)
            printed.append(table)
        if cfg.results_path:
            Path(cfg.results_path).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.results_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
            print(f"results written to {cfg.results_path}")
        if cfg.table_path:
            Path(cfg.table_path).write_text("\n".join(printed))
        if cfg.plot_path:
            Path(cfg.plot_path).parent.mkdir(parents=True, exist_ok=True)
            if cfg.eval_gauntlet:
                if plot_gauntlet({m: r["gauntlet"] for m, r in results.items()}, cfg.plot_path):
                    print(f"gauntlet chart written to {cfg.plot_path}")
            elif plot_task_accuracies({m: r["metrics"] for m, r in results.items()}, cfg.plot_path):
                print(f"task accuracy chart written to {cfg.plot_path}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry eval", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="eval YAML (e.g. yamls/eval/quickstart.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides in Hydra's grammar")
    args = parser.parse_args(argv)
    cfg = read_config(args.recipe, args.overrides)
    level = (cfg.python_log_level or "info").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(levelname)s %(name)s: %(message)s")
    run_eval(cfg)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
