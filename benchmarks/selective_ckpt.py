"""Activation memory of each fsdp_config.activation_checkpointing_mode (#30) at the MPT shapes of the GPU issue,
measured by torch's MemTracker on fake tensors (no memory is allocated, so the 1B shape runs on a laptop), with the
matmuls each mode recomputes in backward (counted by a dispatch mode): the trade the modes offer, before a GPU
measures their speed.

    python benchmarks/selective_ckpt.py [--shape 1b] [--seq 2048] [--micro 1]

Prints, per mode: activations held between forward and backward per block and sample (bf16 weights, as under
FSDP2's param_dtype bf16; sdpa: on a GPU its flash kernel saves what the CPU flash kernel saves here), and the
forward matmuls recomputed per block in backward.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils._python_dispatch import TorchDispatchMode

from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.train import parallel
from llmfoundry.train.recipe import validate
from llmfoundry.train.settings import FSDPConfig

SHAPES = {"125m": (768, 12), "350m": (1024, 16), "1b": (2048, 16)}  # (d_model, n_heads)
MODES = [None, "full", "selective_op", "selective_layer_2"]
# per-block figures: the difference between a 3-block and a 1-block model, halved (the embeddings, the output head
# and the logits, the same in both, drop out; selective_layer_2 checkpoints one of the two extra blocks)
LAYERS = (1, 3)


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count["mm"] += 1
        return func(*args, **(kwargs or {}))


def measure(d_model: int, n_heads: int, seq: int, micro: int, mode: str | None, layers: int) -> tuple[int, int]:
    """(activation bytes held after forward, matmuls run in backward) for a ``layers``-block model."""
    with torch.device("meta"):
        model = MPTForCausalLM(MPTConfig(d_model=d_model, n_heads=n_heads, n_layers=layers, expansion_ratio=4,
                                         max_seq_len=seq, vocab_size=50368, attn_config={"attn_impl": "sdpa"}))
    model = model.to(torch.bfloat16)  # as FSDP2's param_dtype bf16 computes (autocast's weight casts would count)
    fsdp = None if mode is None else validate({"activation_checkpointing": True,
                                               "activation_checkpointing_mode": mode}, FSDPConfig)
    with FakeTensorMode(allow_non_fake_inputs=True):
        parallel.parallelize(model.train(), fsdp=fsdp, compile_cfg=None, precision="fp32",
                             device=torch.device("cpu"), world_size=1, seed=0)
        ids = torch.zeros((micro, seq), dtype=torch.long)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            loss = model(ids, labels=ids).loss
            held = next(iter(tracker.get_tracker_snapshot("current").values()))[_MemRefType.ACT]
        with CountMatmuls() as counter:
            loss.backward()
    return held, counter.count["mm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="1b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro", type=int, default=1)
    args = parser.parse_args()
    d_model, n_heads = SHAPES[args.shape]
    per_block = {}
    for mode in MODES:
        (small, small_mm), (large, large_mm) = (measure(d_model, n_heads, args.seq, args.micro, mode, n)
                                                for n in LAYERS)
        blocks = LAYERS[1] - LAYERS[0]
        per_block[mode] = ((large - small) / blocks, (large_mm - small_mm) / blocks)
    base_bytes, base_mm = per_block[None]
    print(f"{args.shape} (d_model {d_model}), seq {args.seq}, microbatch {args.micro}, bf16 weights, sdpa")
    print("| mode | activations per block and sample (MiB) | vs none | forward matmuls recomputed per block |")
    print("|---|---|---|---|")
    for mode, (held, mms) in per_block.items():
        print(f"| {mode or 'none'} | {held / args.micro / 2**20:.1f} | {held / base_bytes:.2f} | {mms - base_mm:.1f} |")

if __name__ == "__main__":
    main()
