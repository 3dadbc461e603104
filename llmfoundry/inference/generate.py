"""`llmfoundry generate MODEL --prompt TEXT [--prompt ...] --max_new_tokens N --temperature 0`.

MODEL is one of our checkpoints or a Hugging Face folder (ours or transformers-native). Prompts are batched with
left padding; temperature 0 means greedy decoding. Completions go to stdout, the speed to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.inference.sampling import (
    add_sampling_arguments,
    check_room,
    check_sampling_arguments,
    sampling_options,
)
from llmfoundry.loading import load_model


def generate_ids(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, repetition_penalty: float = 1.0,
                 batch_size: int | None = None) -> list[list[int]]:  # fmt: skip
    """The new token ids for each prompt (padding and anything after EOS removed)."""
    tokenizer.padding_side = "left"  # generation appends on the right, so real tokens must end each row
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    options = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id,
                   use_cache=True, **sampling_options(temperature, top_p, top_k, repetition_penalty))  # fmt: skip
    results: list[list[int]] = []
    step = batch_size or len(prompts)
    for start in range(0, len(prompts), step):
        batch = prompts[start : start + step]
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token_id = pad_id
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        check_room(model, enc["input_ids"].shape[1], max_new_tokens)
        with torch.no_grad():
            out = model.generate(enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device), **options)
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            if tokenizer.eos_token_id is not None and tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            results.append(row)
    return results


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
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, device=args.device)
    start = time.perf_counter()
    outputs = generate_ids(model, tokenizer, prompts, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                           repetition_penalty=args.repetition_penalty, batch_size=args.batch_size)  # fmt: skip
    seconds = time.perf_counter() - start
    for i, (prompt, ids) in enumerate(zip(prompts, outputs)):
        print(f"### completion {i}\n{prompt}{tokenizer.decode(ids, skip_special_tokens=True)}")
    n_tokens = sum(len(ids) for ids in outputs)
    print(f"generated {n_tokens} tokens in {seconds:.2f} s ({n_tokens / max(seconds, 1e-9):.1f} tokens/s)", file=sys.stderr)
    return 0
