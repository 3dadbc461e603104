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

This module reads and validates the recipe without torch (a mistake is answered at once); the evaluation itself is
commands/eval_run.py, imported for a valid recipe only.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from llmfoundry.config.load import load_config
from llmfoundry.config.validate import validate
from llmfoundry.eval.config import EvalConfig, load_eval_config
from llmfoundry.train.settings import FSDPConfig


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry eval", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="eval YAML (e.g. yamls/eval/quickstart.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (OmegaConf dot-list, the value read as "
                        "YAML, as llm-foundry reads them; also +key=value and ~key)")
    args = parser.parse_args(argv)
    cfg = read_config(args.recipe, args.overrides)
    level = (cfg.python_log_level or "info").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(levelname)s %(name)s: %(message)s")
    from llmfoundry.commands.eval_run import run_eval  # the heavy stage, for a valid recipe only (module docstring)

    run_eval(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
