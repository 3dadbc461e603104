"""Training-step time of our MPT vs transformers' MptForCausalLM: same config, same batch, same process.

One step = forward + loss + backward + AdamW step. Both models get identical weights (ours exported with
llmfoundry.models.hf_export), warm up, then alternate timed steps so that machine noise hits both equally.

    python benchmarks/model_step.py                      # CPU, MPT-125M shape, seq 512 and 2048
    python benchmarks/model_step.py --device cuda --dtype bf16 --seq 2048 --batch 8

Prints one line per sequence length with both times and the ratio (theirs / ours; > 1 means we are faster).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from llmfoundry.models.hf_export import to_transformers
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

MPT_125M = dict(d_model=768, n_heads=12, n_layers=12, expansion_ratio=4, vocab_size=50368, no_bias=True,
                learned_pos_emb=False, norm_type="low_precision_layernorm", attn_config={"alibi": True})  # fmt: skip


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_step(model, batch, device: str, dtype: torch.dtype):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    autocast = (
        torch.autocast(device.split(":")[0], dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    )

    def step() -> float:
        _sync(device)
        start = time.perf_counter()
        with autocast:
            logits = model(batch).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - start

    return step


def run(seq: int, batch_size: int, steps: int, warmup: int, device: str, dtype: torch.dtype, n_layers: int) -> dict:
    torch.manual_seed(0)
    config = MPTConfig(**{**MPT_125M, "n_layers": n_layers, "max_seq_len": seq})
    ours = MPTForCausalLM(config)
    theirs = to_transformers(ours)  # same weights, transformers' own implementation
    ours.to(device).train()
    theirs.to(device).train()
    batch = torch.randint(0, config.vocab_size, (batch_size, seq), device=device)
    step_ours, step_theirs = make_step(ours, batch, device, dtype), make_step(theirs, batch, device, dtype)
    for _ in range(warmup):
        step_ours(), step_theirs()
    t_ours, t_theirs = [], []
    for _ in range(steps):  # interleave so that drifting machine load affects both equally
        t_ours.append(step_ours())
        t_theirs.append(step_theirs())
    ours_s, theirs_s = statistics.median(t_ours), statistics.median(t_theirs)
    return dict(seq=seq, ours=ours_s, theirs=theirs_s, ratio=theirs_s / ours_s, tokens_s=batch_size * seq / ours_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--n_layers", type=int, default=12)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu x{torch.get_num_threads()} threads"
    print(f"# MPT-125M shape (d_model 768, 12 heads, {args.n_layers} layers, ALiBi), batch {args.batch}, "
          f"{args.dtype}, {where}, torch {torch.__version__}; median of {args.steps} steps after {args.warmup} warmup")  # fmt: skip
    print(f"{'seq':>6} {'ours s/step':>12} {'transformers s/step':>20} {'speedup':>8} {'our tok/s':>10}")
    for seq in args.seq:
        r = run(seq, args.batch, args.steps, args.warmup, args.device, dtype, args.n_layers)
        print(f"{r['seq']:>6} {r['ours']:>12.3f} {r['theirs']:>20.3f} {r['ratio']:>7.2f}x {r['tokens_s']:>10.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
