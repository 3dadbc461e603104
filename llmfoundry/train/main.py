"""`llmfoundry train RECIPE.yaml [overrides]` (also `python scripts/train.py ...` and under torchrun)."""

from __future__ import annotations

import argparse
import logging

from llmfoundry.config.load import load_config
from llmfoundry.config.schema import TrainConfig, validate


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmfoundry train",
        description="Train from a YAML recipe. Overrides use Hydra's grammar: key=value, +key=value, ~key.",
    )
    parser.add_argument("recipe", help="path of the YAML recipe, e.g. yamls/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_duration=10ba")
    return parser.parse_args(argv)


def load_train_config(recipe: str, overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The validated TrainConfig and the resolved plain config it came from."""
    plain = load_config(recipe, overrides)
    return validate(plain, TrainConfig), plain


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cfg, plain = load_train_config(args.recipe, args.overrides)
    if cfg.python_log_level:
        logging.basicConfig(level=cfg.python_log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    from llmfoundry.train import dist
    from llmfoundry.train.trainer import Trainer

    try:
        Trainer(cfg, plain).fit()
    finally:
        dist.destroy()
    return 0
