"""`llmfoundry eval RECIPE.yaml [overrides]`: score models on ICL tasks and the gauntlet.

The recipe has llm-foundry's eval shape (``models`` list, ``icl_tasks``, ``eval_gauntlet``, ``max_seq_len``,
``device_eval_batch_size``, ``precision``, ...; see llmfoundry.eval.config.EvalConfig). Each model is a Hugging
Face folder (``load_path`` or ``model.pretrained_model_name_or_path``) or one of our training checkpoints
(``load_path``), local or ``s3://``; a ``model`` section is validated and built as in training (see
llmfoundry.loading). Prints a markdown table per model and the gauntlet table, writes ``results_path`` (JSON),
logs to the recipe's ``loggers`` and, with ``plot_path``, draws a bar chart (gauntlet scores, or task accuracies
without a gauntlet). Under torchrun the examples are split across ranks; with ``fsdp_config`` each model is also
sharded across them (commands/eval_model.py). ``eval_loader`` / ``eval_loaders`` add language-modelling metrics
(``metrics/eval/LanguageCrossEntropy``, ...) per model; ``callbacks`` run around each model's evaluation.
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
import yaml

from llmfoundry import registry
from llmfoundry.commands.eval_model import EvalRun, StepTime, evaluate_model
from llmfoundry.config.load import load_config
from llmfoundry.core.secrets import mask_secrets
from llmfoundry.config.validate import to_plain, validate
from llmfoundry.core.dist import init_distributed
from llmfoundry.core.notices import notice_once
from llmfoundry.core.precision import supported_precision
from llmfoundry.eval.config import EvalConfig, load_eval_config
from llmfoundry.eval.gauntlet import (
    gauntlet_table,
    plot_gauntlet,
    plot_task_accuracies,
    tasks_table,
)
from llmfoundry.eval.icl.data import check_task_files
from llmfoundry.train.builders import build_named
from llmfoundry.train.settings import FSDPConfig

log = logging.getLogger("llmfoundry.eval")


def read_config(path: str, overrides: list[str]) -> EvalConfig:
    """The validated recipe (YAML + key=value overrides as llm-foundry reads them + interpolation, then the schema)."""
    return validate_eval_recipe(load_config(path, overrides, EvalConfig))


def validate_eval_recipe(plain: dict[str, Any]) -> EvalConfig:
    """An eval recipe's plain values validated; ``fsdp_config`` against the training recipe's FSDP settings (they
    live in the train layer, above the eval recipe's schema)."""
    cfg = load_eval_config(plain)
    if cfg.fsdp_config is not None:
        cfg.fsdp_config = validate(cfg.fsdp_config, FSDPConfig, "fsdp_config")
    return cfg


def build_loggers(cfg: EvalConfig, run_name: str) -> list:
    """The recipe's loggers, built by the trainer's registry builders (rank 0 only)."""
    if not cfg.loggers:
        return []
    return build_named(registry.loggers, cfg.loggers, run_name)


def run_eval(cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """Evaluate every model; returns ``{model_name: {"metrics": ..., "gauntlet": ...}}`` (printed on rank 0)."""
    check_task_files(cfg.icl_tasks)  # a missing task file shows before any model is loaded
    info = init_distributed(cfg.dist_timeout)
    cfg.precision, note = supported_precision(cfg.precision, info.device, doing="evaluates")
    if note:
        notice_once(note)
    torch.manual_seed(cfg.seed)
    results: dict[str, dict[str, Any]] = {}
    printed: list[str] = []
    # as llm-foundry: the recipe's run_name, else $RUN_NAME (llm-foundry then uses 'llm'; we generate one)
    run_name = cfg.run_name or os.environ.get("RUN_NAME") or time.strftime("eval-%Y%m%d-%H%M%S")
    loggers = build_loggers(cfg, run_name) if info.is_main else []
    callbacks = build_named(registry.callbacks, cfg.callbacks)
    if cfg.log_config:
        logged = mask_secrets(to_plain(cfg))
        if info.is_main:
            print(yaml.safe_dump(logged, sort_keys=False), flush=True)
        for logger in loggers:
            logger.log_hyperparameters(logged)
    try:
        for step, spec in enumerate(cfg.models):
            run = EvalRun(cfg, run_name, info, loggers, callbacks, StepTime(step))
            results[spec.model_name] = result = evaluate_model(run, spec)
            if info.is_main:
                _show(spec.model_name, result, step, printed, loggers)
            run.model = None  # the next model's weights replace these
    finally:
        for logger in loggers:
            logger.close()
    if info.is_main:
        _write_outputs(cfg, results, printed)
    return results


def _show(model_name: str, result: dict[str, Any], step: int, printed: list[str], loggers: list) -> None:
    if any(k.startswith("icl/") for k in result["metrics"]):
        table = f"## {model_name}\n\n{tasks_table(result['metrics'])}\n"
        print(table, flush=True)
        printed.append(table)
    logged = {f"{model_name}/{k}": float(v) for k, v in {**result["metrics"], **result["gauntlet"]}.items()}
    for logger in loggers:
        logger.log_metrics(logged, step)


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
