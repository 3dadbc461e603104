"""``llmfoundry eval`` for a validated recipe: every model scored, its tables printed and its results written
(the recipe is read and checked by commands/eval.py, which documents the recipe's keys)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from llmfoundry import registry
from llmfoundry.commands.eval_model import EvalRun, evaluate_model
from llmfoundry.core.secrets import mask_secrets
from llmfoundry.config.validate import to_plain
from llmfoundry.core.dist import data_share, init_distributed
from llmfoundry.core.notices import notice_once
from llmfoundry.core.precision import supported_precision
from llmfoundry.eval.config import EvalConfig
from llmfoundry.eval.gauntlet import (
    gauntlet_table,
    plot_gauntlet,
    plot_task_accuracies,
    tasks_table,
)
from llmfoundry.eval.icl.data import check_task_files
from llmfoundry.train.builders import build_named
from llmfoundry.train.state import TrainState, TrainTime

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
            state = TrainState(run_name=run_name, dist=info, precision=cfg.precision, data_share=data_share(),
                               loggers=loggers, time=TrainTime(batch=step))
            run = EvalRun(cfg, callbacks, state)
            results[spec.model_name] = result = evaluate_model(run, spec)
            if info.is_main:
                _show(spec.model_name, result, step, printed, loggers)
            state.model = None  # the next model's weights replace these
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
