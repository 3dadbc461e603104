"""Training throughput (tokens/s) and MFU of MPT recipes, one device.

One step = forward + next-token loss + backward + AdamW, on synthetic token batches, exactly as the trainer runs
them (llmfoundry.core.precision autocast; torch.compile per block via llmfoundry.train.parallel). MFU = achieved
model FLOP/s (``model.flops_per_token(seq)``, 6N + 12·L·d·T) / the device's dense bf16 peak (A100 312,
H100/H200 989 TFLOP/s; ``--peak-tflops`` for other devices; none on CPU).

    python benchmarks/mfu.py                                   # CPU: a tiny MPT, fp32
    python benchmarks/mfu.py --models 125m 350m 1b --seq 2048 --device cuda --precision amp_bf16 \\
        --attn sdpa flash --compile --microbatch 4 8 16 32    # the GPU sweep (best line per model is marked *)

A microbatch that runs out of GPU memory is reported as OOM and the sweep goes on.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

from llmfoundry.core import precision
from llmfoundry.models.mpt.arch import MPTArch
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.train import parallel
from llmfoundry.train.callbacks.speed_monitor import device_peak_tflops
from llmfoundry.train.settings import CompileConfig

_MPT = dict(expansion_ratio=4, vocab_size=50368, no_bias=True, learned_pos_emb=False,
            norm_type="low_precision_layernorm")
# llm-foundry's MPT recipe shapes (yamls/mpt/*.yaml)
SHAPES = {
    "tiny": dict(d_model=64, n_heads=4, n_layers=2, expansion_ratio=4, vocab_size=512, learned_pos_emb=False),
    "125m": dict(_MPT, d_model=768, n_heads=12, n_layers=12),
    "350m": dict(_MPT, d_model=1024, n_heads=16, n_layers=24),
    "760m": dict(_MPT, d_model=1536, n_heads=12, n_layers=24),
    "1b": dict(_MPT, d_model=2048, n_heads=16, n_layers=24),
    "3b": dict(_MPT, d_model=2560, n_heads=20, n_layers=32),
    "7b": dict(_MPT, d_model=4096, n_heads=32, n_layers=32),
}


def build(shape: str, seq: int, attn: str, device: torch.device, prec: str) -> MPTForCausalLM:
    from llmfoundry.config.validate import validate

    spec = dict(SHAPES[shape], max_seq_len=seq)
    spec["attn_config"] = {"alibi": True, "attn_impl": attn}
    arch = validate(spec, MPTArch, "model")
    torch.manual_seed(0)
    return MPTForCausalLM(MPTConfig.from_arch(arch)).to(device, precision.weight_dtype(prec))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model, device, prec: str, batch: int, micro: int, seq: int, steps: int, warmup: int) -> float:
    """Seconds per optimizer step of ``batch`` samples in microbatches of ``micro`` (median of ``steps``)."""
    vocab = model.get_input_embeddings().num_embeddings
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    data = torch.randint(0, vocab, (batch, seq), device=device)
    tokens = batch * (seq - 1)
    times = []
    for i in range(warmup + steps):
        sync(device)
        start = time.perf_counter()
        for s in range(0, batch, micro):
            x = data[s:s + micro]
            with precision.autocast(prec, device):
                logits = model(x).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), x[:, 1:].reshape(-1),
                                   reduction="sum") / tokens
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny"], choices=sorted(SHAPES))
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: 2048 on GPU, 128 on CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", default=None, choices=["fp32", "amp_bf16", "amp_fp16", "bf16"],
                   help="default: amp_bf16 on GPU, fp32 on CPU")
    p.add_argument("--attn", nargs="+", default=["sdpa"], choices=["torch", "sdpa", "flash"])
    p.add_argument("--compile", action="store_true", help="torch.compile each block (also run without)")
    p.add_argument("--microbatch", nargs="+", type=int, default=None, help="microbatch sizes to sweep")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: the largest microbatch)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=None)
    args = p.parse_args(argv)

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    seq = args.seq or (2048 if gpu else 128)
    prec = args.precision or ("amp_bf16" if gpu else "fp32")
    micros = args.microbatch or ([8] if gpu else [4])
    peak = args.peak_tflops or device_peak_tflops(device)
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if gpu else f"cpu x{torch.get_num_threads()} threads"
    print(f"# {name}, torch {torch.__version__}, {prec}, seq {seq}, peak "
          f"{f'{peak:g} TFLOP/s' if peak else 'unknown (no MFU)'}; median of {args.steps} steps after {args.warmup}")
    print(f"{'model':>6} {'attn':>5} {'compile':>7} {'micro':>5} {'batch':>5} {'s/step':>8} {'tok/s':>10} "
          f"{'TFLOP/s':>8} {'MFU':>6}")
    for shape in args.models:
        best = None
        lines = []
        for attn, compiled in itertools.product(args.attn, [False, True] if args.compile else [False]):
            for micro in micros:
                batch = args.batch or max(micros)
                model = build(shape, seq, attn, device, prec)
                if compiled:
                    parallel.parallelize(model, fsdp=None, compile_cfg=CompileConfig(), precision=prec, device=device,
                                         world_size=1, seed=0)
                try:
                    seconds = measure(model, device, prec, batch, micro, seq, args.steps, args.warmup)
                except torch.cuda.OutOfMemoryError:
                    lines.append((None, f"{shape:>6} {attn:>5} {str(compiled):>7} {micro:>5} {batch:>5}      OOM"))
                    continue
                finally:
                    del model
                    if gpu:
                        torch.cuda.empty_cache()
                fpt = build(shape, seq, attn, torch.device("meta"), prec).flops_per_token(seq)
                tok_s = batch * seq / seconds
                tflops = tok_s * fpt / 1e12
                mfu = tflops / peak if peak else None
                text = (f"{shape:>6} {attn:>5} {str(compiled):>7} {micro:>5} {batch:>5} {seconds:8.3f} {tok_s:10.0f} "
                        f"{tflops:8.3f} {f'{100 * mfu:5.1f}%' if mfu is not None else '     -'}")
                lines.append((tok_s, text))
                if best is None or tok_s > best:
                    best = tok_s
        for tok_s, text in lines:
            print(text + (" *" if tok_s is not None and tok_s == best and len(lines) > 1 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
