"""One attention layer under the masks SDPA can only take densely: the dense-mask SDPA path against FlexAttention.

For each case the mask is built the way ``MPTModel.forward`` builds it (``AttentionMask.build``, once per forward,
shared by all blocks) and then one layer's attention runs forward + backward (forward only where torch has no
FlexAttention backward, i.e. on a CPU). Printed per case: the mask build time, the attention time of each path,
their ratio, and each path's largest error against the explicit reference (``_attend_torch``) in fp32: in the
outputs of real (unpadded) queries, and in the input gradients where there are any.

    python benchmarks/attention_masks.py                              # CPU, small shape, forward only
    python benchmarks/attention_masks.py --device cuda --dtype bf16   # the MPT-1B layer shape (B 8, H 16, T 2048)
    python benchmarks/attention_masks.py --device cuda --model        # + a whole MPT-1B train step (ALiBi, packed)

``--model`` times forward + backward of the whole MPT-1B shape (d_model 2048, 24 layers, seq 2048, bf16 autocast,
eager) with ALiBi and ``attn_uses_sequence_id`` on packed rows: attn_impl sdpa as it now runs in training
(FlexAttention) against the same model with FlexAttention switched off (the dense mask, as before).

A CPU run is no speed claim: FlexAttention is fast only compiled, on a GPU; on a CPU it is torch's eager reference
(which materialises the scores), there for tests.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from llmfoundry.models.layers import flex_attention
from llmfoundry.models.layers.attention import Attention, AttentionMask, _attend_sdpa, _attend_torch
from llmfoundry.models.layers.positional import alibi_slopes
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

CASES = ("causal", "alibi", "packed", "padding", "alibi_packed_padding", "window")


def _inputs(case: str, B: int, T: int, H: int, docs: int, device):
    g = torch.Generator().manual_seed(0)
    slopes = alibi_slopes(H) if "alibi" in case else None
    sequence_id = padding = None
    window = T // 4 if case == "window" else -1
    if "packed" in case:  # documents of random lengths, packed into each row
        cuts = torch.sort(torch.randint(1, T, (B, docs - 1), generator=g), dim=-1).values
        sequence_id = (torch.arange(T)[None, None, :] >= cuts[:, :, None]).sum(dim=1).to(device)
    if "padding" in case:  # a quarter of each row right-padded
        padding = torch.ones(B, T, dtype=torch.long, device=device)
        padding[:, -T // 4:] = 0
    return slopes, sequence_id, padding, window


def _time(fn, device, iters: int) -> float:
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def run(args) -> list[str]:
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    backward = flex_attention.trains_on(device)
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype).requires_grad_(backward)
               for _ in range(3))
    grad = torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype)
    scale = D**-0.5
    q_pos = torch.arange(T, device=device)
    rows = [f"{device} {args.dtype}, B {B}, H {H}, T {T}, head_dim {D}, {args.docs} documents per packed row; "
            f"{'forward + backward' if backward else 'forward only'}, mean of {args.iters}", "",
            "| case | build dense / flex (ms) | SDPA dense mask (ms) | FlexAttention (ms) | dense / flex "
            "| output error dense / flex | input-gradient error dense / flex |",
            "|---|---|---|---|---|---|---|"]
    for case in args.cases:
        slopes, sequence_id, padding, window = _inputs(case, B, T, H, args.docs, device)

        def build(mode):
            return AttentionMask.build(q_pos, T, padding, sequence_id, slopes, window, dtype, mode)

        dense, flex = build("off"), build("on")

        def step(attend):
            out = attend()
            if backward:
                torch.autograd.backward(out, grad)
            return out

        def sdpa():
            return _attend_sdpa(q, k, v, dense, scale, 0.0, False)

        def flex_step():
            return flex_attention.flex_attend(q, k, v, flex.flex, scale, None)

        with torch.set_grad_enabled(backward):
            t_build = [_time(lambda mode=mode: build(mode), device, args.iters) for mode in ("off", "on")]
            t_sdpa = _time(lambda: step(sdpa), device, args.iters)
            t_flex = _time(lambda: step(flex_step), device, args.iters)
            # both paths against the explicit reference in fp32, so that a difference says which path is off
            ref_mask = AttentionMask.build(q_pos, T, padding, sequence_id, slopes, window, torch.float32, "off")
            inputs = [x.detach().float().requires_grad_(backward) for x in (q, k, v)]
            ref = step(lambda: _attend_torch(*inputs, ref_mask, scale, None, 0.0, False))
            ref_grads = [x.grad for x in inputs] if backward else []
            valid = torch.ones(B, T, dtype=torch.bool, device=device) if padding is None else padding.bool()
            errors = []
            for attend in (sdpa, flex_step):
                for x in (q, k, v):
                    x.grad = None
                out = step(attend)
                err = (out.float() - ref).abs()[valid[:, None, :, None].expand_as(out)].max().item()
                grads = [(x.grad.float() - r).abs().max().item() for x, r in zip((q, k, v), ref_grads)]
                errors.append((f"{err:.1e}", f"{max(grads):.1e}" if grads else "-"))
        rows.append(f"| {case} | {t_build[0] * 1e3:.2f} / {t_build[1] * 1e3:.2f} | {t_sdpa * 1e3:.2f} | "
                    f"{t_flex * 1e3:.2f} | {t_sdpa / t_flex:.2f}x | {errors[0][0]} / {errors[1][0]} | "
                    f"{errors[0][1]} / {errors[1][1]} |")
        print(rows[-1], flush=True)
    return rows


def model_step(args) -> list[str]:
    device = torch.device(args.device)
    B, T = args.model_batch, 2048
    cfg = MPTConfig(d_model=2048, n_heads=16, n_layers=24, max_seq_len=T, vocab_size=50368, no_bias=True,
                    learned_pos_emb=False, attn_config={"alibi": True, "attn_uses_sequence_id": True})
    model = MPTForCausalLM(cfg).to(device).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50368, (B, T), generator=g).to(device)
    cuts = torch.sort(torch.randint(1, T, (B, args.docs - 1), generator=g), dim=-1).values
    sequence_id = (torch.arange(T)[None, None, :] >= cuts[:, :, None]).sum(dim=1).to(device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, sequence_id=sequence_id, labels=x).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    t_flex = _time(step, device, args.iters)
    with mock.patch.object(Attention, "flex_mode", lambda self, x: "off"):
        t_dense = _time(step, device, args.iters)
    tokens = B * T
    return ["", f"MPT-1B shape (d 2048, 24 layers, seq 2048), ALiBi + packed documents ({args.docs} per row), "
            f"batch {B}, bf16 autocast, eager, forward + backward, mean of {args.iters}", "",
            "| attention | step (ms) | tok/s |", "|---|---|---|",
            f"| SDPA, dense mask (before) | {t_dense * 1e3:.0f} | {tokens / t_dense:,.0f} |",
            f"| FlexAttention (sdpa in training now) | {t_flex * 1e3:.0f} | {tokens / t_flex:,.0f} |",
            f"| ratio | {t_dense / t_flex:.2f}x | |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch", type=int, default=None, help="default: 8 on CUDA, 2 on CPU")
    parser.add_argument("--heads", type=int, default=None, help="default: 16 on CUDA, 4 on CPU")
    parser.add_argument("--seq", type=int, default=None, help="default: 2048 on CUDA, 512 on CPU")
    parser.add_argument("--head-dim", type=int, default=None, help="default: 128 on CUDA, 64 on CPU")
    parser.add_argument("--docs", type=int, default=8, help="documents per packed row")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--model", action="store_true", help="also time a whole MPT-1B train step (CUDA)")
    parser.add_argument("--model-batch", type=int, default=4)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    for name, on_gpu, on_cpu in (("batch", 8, 2), ("heads", 16, 4), ("seq", 2048, 512), ("head_dim", 128, 64)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if cuda else on_cpu)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    rows = run(args)
    print("\n".join(rows[:4]))
    if args.model:
        rows += model_step(args)
        print("\n".join(rows[-8:]))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
