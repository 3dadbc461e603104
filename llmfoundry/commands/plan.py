"""`llmfoundry plan RECIPE.yaml [overrides] --nodes N --gpus-per-node G [--gpu h100]`: whether a recipe fits, how
fast it trains and what to change, estimated on this machine without allocating anything real.

The recipe is read and validated as `llmfoundry train` does (the same one-line errors); the model is built by the
trainer's builder on the meta device and its activations measured on fake tensors (llmfoundry/train/plan.py,
plan_memory.py); the GPU figures and their sources are in llmfoundry/train/plan_hardware.py.
"""

from __future__ import annotations

import argparse

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.compat import device_batch_size
from llmfoundry.train.recipe import load_train_config

KINDS = ("h100", "h200", "a100", "a100-40gb", "b200", "l40s")  # plan_hardware.GPUS, named without torch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmfoundry plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="path of the YAML recipe")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, as for llmfoundry train")
    parser.add_argument("--nodes", type=int, required=True, help="nodes")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per node")
    parser.add_argument("--gpu", default="h100", help=f"the GPU kind: {', '.join(KINDS)} (default h100)")
    parser.add_argument("--no-proposals", action="store_true", help="print the estimate only")
    return parser.parse_intermixed_args(argv)


def check_flags(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise ConfigError(f"--nodes: {args.nodes} (use 1 or more)")
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node: {args.gpus_per_node} (use 1 or more)")
    if args.gpu.lower() not in KINDS:
        raise ConfigError(f"--gpu: '{args.gpu}' is not a GPU kind plan knows (use one of {', '.join(KINDS)})")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    check_flags(args)
    cfg, _ = load_train_config(args.recipe, args.overrides)  # the same errors as llmfoundry train
    device_batch_size(cfg.global_train_batch_size, args.nodes * args.gpus_per_node, cfg.tp_config)
    from llmfoundry.train.plan_report import report  # the heavy stage (torch), for a valid recipe only

    print(report(cfg, args.recipe, args.nodes, args.gpus_per_node, args.gpu.lower(), not args.no_proposals))
    return 0
