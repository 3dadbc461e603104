"""`llmfoundry eval RECIPE.yaml [overrides]`: score models on ICL tasks and the gauntlet.

The recipe has llm-foundry's eval shape (``models`` list, ``icl_tasks``, ``eval_gauntlet``, ``max_seq_len``,
``device_eval_batch_size``, ``precision``, ...; see llmfoundry.eval.config.EvalConfig). Each model is a Hugging
Face folder (``load_path`` or ``model.pretrained_model_name_or_path``) or one of our training checkpoints
(``load_path``), local or ``s3://``; a ``model`` section is validated and built as in training (see
llmfoundry.loading). Prints a markdown table per model and the gauntlet table, writes ``results_path`` (JSON),
logs to the recipe's ``loggers`` and, with ``plot_path``, draws a bar chart (gauntlet scores, or task accuracies
without a gauntlet). Under torchrun the examples are split across ranks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from llmfoundry import registry
from llmfoundry.config.load import load_config
from llmfoundry.config.validate import to_plain
from llmfoundry.core.dist import init_distributed
from llmfoundry.eval.config import EvalConfig, load_eval_config
from llmfoundry.eval.gauntlet import (
    compute_gauntlet,
    gauntlet_table,
    plot_gauntlet,
    plot_task_accuracies,
    tasks_table,
)
from llmfoundry.eval.icl.data import check_task_files
from llmfoundry.eval.runner import ICLEvaluator
from llmfoundry.loading import load_eval_model
from llmfoundry.train.builders import build_named

log = logging.getLogger("llmfoundry.eval")


def read_config(path: str, overrides: list[str]) -> EvalConfig:
    """The validated recipe (YAML + key=value overrides as llm-foundry reads them + interpolation, then the schema)."""
    return load_eval_config(load_config(path, overrides, EvalConfig))


def build_loggers(cfg: EvalConfig, run_name: str) -> list:
    """The recipe's loggers, built by the trainer's registry builders (rank 0 only)."""
    if not cfg.loggers:
        return []
    return build_named(registry.loggers, cfg.loggers, run_name)


def run_eval(cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """Evaluate every model; returns ``{model_name: {"metrics": ..., "gauntlet": ...}}`` (printed on rank 0)."""
    check_task_files(cfg.icl_tasks)  # a missing task file shows before any model is loaded
    info = init_distributed(cfg.dist_timeout)
    torch.manual_seed(cfg.seed)
    results: dict[str, dict[str, Any]] = {}
    printed: list[str] = []
    # as llm-foundry: the recipe's run_name, else $RUN_NAME (llm-foundry then uses 'llm'; we generate one)
    run_name = cfg.run_name or os.environ.get("RUN_NAME") or time.strftime("eval-%Y%m%d-%H%M%S")
    loggers = build_loggers(cfg, run_name) if info.is_main else []
    for logger in loggers:
        logger.log_hyperparameters(to_plain(cfg))
    try:
        _evaluate_models(cfg, info, results, printed, loggers)
    finally:
        for logger in loggers:
            logger.close()
    if info.is_main:
        _write_outputs(cfg, results, printed)
    return results


def _evaluate_models(cfg: EvalConfig, info, results: dict, printed: list[str], loggers: list) -> None:
    for step, spec in enumerate(cfg.models):
        start = time.perf_counter()
        model, tokenizer = load_eval_model(spec, info.device, max_seq_len=cfg.max_seq_len, precision=cfg.precision)
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
            logged = {f"{spec.model_name}/{k}": float(v) for k, v in {**metrics, **gauntlet}.items()}
            for logger in loggers:
                logger.log_metrics(logged, step)
        del model


def _write_outputs(cfg: EvalConfig, results: dict, printed: list[str]) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry eval", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="eval YAML (e.g. yamls/eval/quickstart.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (OmegaConf dot-list, the value read as "
                        "YAML, as llm-foundry reads them; also +key=value and ~key)")
    args = parser.parse_args(argv)
    cfg = read_config(args.recipe, args.overrides)
    level = (cfg.python_log_level or "info").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(levelname)s %(name)s: %(message)s")
    run_eval(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
