"""The chunked cross-entropy (causal_lm_loss, #30) against F.cross_entropy on the upcast logits
(reference_causal_lm_loss): whether loss and gradient are bitwise equal, the peak memory and time of the loss's
forward + backward alone, and the time and peak memory of a whole MPT training step (forward, loss, backward,
AdamW) with each.

    python benchmarks/chunked_loss.py                   # CPU: small shapes (peak memory by torch's MemTracker)
    python benchmarks/chunked_loss.py --device cuda     # 16 x 2048 positions over 50368 tokens, bf16; MPT-125M/350M

Peak memory is what the step allocates above what was allocated before it (the model, its optimizer state and the
logits already there for the loss-only rows), so the difference between the two losses is what the loss costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmfoundry.models.loss import causal_lm_loss, reference_causal_lm_loss
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

LOSSES = {"chunked": causal_lm_loss, "reference": reference_causal_lm_loss}
SHAPES = {"125M": dict(d_model=768, n_heads=12, n_layers=12), "350M": dict(d_model=1024, n_heads=16, n_layers=24),
          "tiny": dict(d_model=64, n_heads=4, n_layers=2)}
MIB = 2 ** 20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(run, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median seconds, peak MiB above what was allocated before) of ``run()``; the first call warms up."""
    run()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        with tracker:
            run()
        peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
    return statistics.median(times), peak / MIB


def loss_only(batch: int, seq: int, vocab: int, device: torch.device, repeats: int) -> None:
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(batch, seq, vocab, device=device, generator=generator).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab, (batch, seq), device=device, generator=generator)
    labels[:, : seq // 8] = -100  # prompts
    results = {}
    for name, fn in LOSSES.items():
        def run(fn=fn):
            logits.grad = None
            loss = fn(logits, labels, "sum")
            loss.backward()
            return loss.detach()

        seconds, peak = measure(run, device, repeats)
        results[name] = (run(), logits.grad.clone(), seconds, peak)
        logits.grad = None
    (loss, grad, *_), (want_loss, want_grad, *_) = results["chunked"], results["reference"]
    bitwise = torch.equal(loss, want_loss) and torch.equal(grad, want_grad)
    print(f"loss only, {batch} x {seq} x {vocab} bf16 logits ({logits.nbytes / MIB:.0f} MiB; fp32 copy "
          f"{logits.nbytes * 2 / MIB:.0f} MiB): bitwise {bitwise} (loss {loss.item():.6f} vs {want_loss.item():.6f})")
    for name, (_, _, seconds, peak) in results.items():
        print(f"  {name:>9}: {seconds * 1e3:8.2f} ms forward+backward, peak +{peak:8.1f} MiB")


def model_step(shape: str, batch: int, seq: int, device: torch.device, repeats: int) -> None:
    torch.manual_seed(0)
    config = MPTConfig(**SHAPES[shape], expansion_ratio=4, vocab_size=50368, max_seq_len=seq, no_bias=True,
                       learned_pos_emb=False, attn_config={"alibi": True})
    model = MPTForCausalLM(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    data = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    row = {}
    for name, fn in LOSSES.items():
        def step(fn=fn):
            with autocast:
                logits = model(data).logits
                loss = fn(logits, data, "sum") / data.numel()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        row[name] = measure(step, device, repeats)
    (ours, ours_peak), (ref, ref_peak) = row["chunked"], row["reference"]
    print(f"MPT-{shape} step, batch {batch} x seq {seq}, amp_bf16: chunked {ours * 1e3:.1f} ms / reference "
          f"{ref * 1e3:.1f} ms ({ref / ours:.3f}x), peak +{ours_peak:.0f} MiB / +{ref_peak:.0f} MiB "
          f"({ref_peak - ours_peak:.0f} MiB less)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    print(f"# chunked cross-entropy vs F.cross_entropy(logits.float()), {where}, torch {torch.__version__}; median "
          f"of {args.repeats} after a warm-up")
    if device.type == "cuda":
        loss_only(16, 2048, 50368, device, args.repeats)
        loss_only(8, 2048, 128256, device, args.repeats)  # a Llama 3 vocabulary
        model_step("125M", 16, 2048, device, args.repeats)
        model_step("350M", 16, 2048, device, args.repeats)
    else:
        loss_only(4, 256, 50368, device, args.repeats)
        model_step("tiny", 4, 256, device, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
