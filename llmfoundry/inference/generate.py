"""`llmfoundry generate MODEL --prompt TEXT [--prompt ...] --max_new_tokens N --temperature 0`.

MODEL is one of our checkpoints or a Hugging Face folder (ours or transformers-native). Prompts are batched with
left padding; temperature 0 means greedy decoding. Completions go to stdout, the speed to stderr.

The flags are checked without torch; the generation itself is inference/generate_run.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmfoundry.core.errors import ConfigError
from llmfoundry.inference.flags import add_sampling_arguments, check_sampling_arguments


def _read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise ConfigError(f"--prompts_file: '{path}' does not exist")
        prompts += [line.rstrip("\n") for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ConfigError("generate: give at least one --prompt or a --prompts_file")
    return prompts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a checkpoint folder of ours or a Hugging Face folder")
    parser.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    parser.add_argument("--prompts_file", help="a text file with one prompt per line")
    parser.add_argument("--batch_size", type=int, default=None, help="prompts per generate call (default: all)")
    add_sampling_arguments(parser, max_new_tokens=64, temperature=0.0, top_p=1.0)
    args = parser.parse_args(argv)
    check_sampling_arguments(args)
    if args.batch_size is not None and args.batch_size <= 0:
        raise ConfigError(f"--batch_size: must be positive, got {args.batch_size}")


    prompts = _read_prompts(args)
    from llmfoundry.inference.generate_run import run_generate  # the model stack, once the flags are good

    return run_generate(args, prompts)
