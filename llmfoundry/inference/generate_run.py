"""`llmfoundry generate` once its flags are checked (inference/generate.py): the model loaded, the prompts
completed in batches."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from llmfoundry.inference.sampling import check_room, device_named, sampling_options
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


def run_generate(args: argparse.Namespace, prompts: list[str]) -> int:
    """Complete ``prompts`` with the model at ``args.model``; completions to stdout, the speed to stderr."""
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, device=device_named(args.device))
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
