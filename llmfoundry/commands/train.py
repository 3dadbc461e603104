"""`llmfoundry train RECIPE.yaml [overrides]` (also `python scripts/train.py ...` and under torchrun).

Several processes: ``torchrun --nproc_per_node N scripts/train.py RECIPE.yaml ...`` (multi-node through torchrun's
rendezvous flags), or ``llmfoundry train -n N RECIPE.yaml ...``, which runs ``python -m torch.distributed.run
--standalone --nproc_per_node N`` on this command line for one machine. There is no launcher of our own.

This module stays free of torch: the recipe is read and validated first, so a mistake in it is answered before the
heavy stack loads; llmfoundry.train.run is imported only for a valid recipe.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import cuda_environment, load_train_config
from llmfoundry.train.compat import device_batch_size

__all__ = ["main", "load_train_config", "cuda_environment"]  # the last two live in train/recipe.py


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmfoundry train",
        description="Train from a YAML recipe. Overrides are read as llm-foundry reads them (OmegaConf dot-lists: "
                    "key=value, the value parsed as YAML); Hydra's +key=value, ++key=value and ~key work too.",
    )
    parser.add_argument("recipe", help="path of the YAML recipe, e.g. yamls/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_duration=10ba")
    parser.add_argument("-n", "--nproc", type=int, default=None,
                        help="processes on this machine (one per GPU): runs the job under torch.distributed.run")
    return parser.parse_args(argv)


def torchrun_command(nproc: int, recipe: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "llmfoundry.cli", "train", recipe, *overrides]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cfg, plain = load_train_config(args.recipe, args.overrides)  # bad input fails here, once, with exit code 2
    if args.nproc is not None and "LOCAL_RANK" not in os.environ:
        if args.nproc < 1:
            raise ConfigError(f"-n: {args.nproc} processes (use 1 or more)")
        if args.nproc > 1:
            # once here, not once per spawned rank
            device_batch_size(cfg.global_train_batch_size, args.nproc, cfg.tp_config)
            return subprocess.call(torchrun_command(args.nproc, args.recipe, args.overrides))
    os.environ.update(cuda_environment(cfg, dict(os.environ)))
    if cfg.python_log_level:
        logging.basicConfig(level=cfg.python_log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    from llmfoundry.train.run import run_training  # the heavy stage, for a valid recipe only (module docstring)

    return run_training(cfg, plain)
