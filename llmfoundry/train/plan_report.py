"""The text `llmfoundry plan` prints: one table per GPU, the communication per step, time and cost to
max_duration, and the proposals (each an estimate of its own)."""

from __future__ import annotations

from llmfoundry.train.plan import Estimate, Planner, recipe_choice
from llmfoundry.train.plan_proposals import proposals
from llmfoundry.train.plan_hardware import GIB, GPUS


# float8 (train/float8.py) is planned as amp_bf16: the fake runs convert no Linear, and under torch.compile the
# partitioner keeps float8 copies where bf16 ones were (benchmarks/results/gpu_h200.md: 1B, microbatch 16, compiled:
# 55.1 GiB measured against 72.3 planned, 0.46 s a step against 0.51)
FLOAT8_NOTE = ("precision amp_fp8 is estimated as amp_bf16 (float8 matmuls and the smaller tensors compile saves "
               "for them are not modelled: on an H200 the 1B recipe took 0.76x this memory and 0.90x this step time)")


def gib(value: float) -> str:
    return f"{value / GIB:8.2f} GiB"


def duration(est: Estimate) -> str:
    hours = est.hours()
    if hours is None:
        return "max_duration in epochs: the dataset's size is not known here"
    return (f"{est.steps} batches: {hours / 24:.1f} days, {hours * est.world:,.0f} GPU-hours")


def table(est: Estimate, gpu_name: str) -> list[str]:
    c = est.choice
    ck = c.checkpointing or "off"  # the mode: full, selective_op, selective_layer_N
    lines = [
        f"per GPU ({est.world} GPUs, {gpu_name}; microbatch {c.micro}, activation_checkpointing {ck}, "
        f"sharding {c.strategy or 'none'} over {est.shard})",
        f"  parameters           {gib(est.params)}",
        f"  gradients            {gib(est.grads)}",
        f"  optimizer state      {gib(est.optimizer)}",
        f"  activations          {gib(est.activations)}   (checkpointing {'off' if c.checkpointing else 'full'}: "
        f"{gib(est.activations_other).strip()})",
        f"  gradients held       {gib(est.grads_held)}   (during forward/backward)",
        f"  FSDP gathered        {gib(est.fsdp_gathered)}",
        f"  peak                 {gib(est.peak)}   of {gib(est.memory).strip()}: "
        + (f"fits, {gib(est.memory - est.peak).strip()} headroom" if est.fits else
           f"DOES NOT FIT ({gib(est.peak - est.memory * 0.95).strip()} over 95%)"),
    ]
    for name, value in est.comm_bytes.items():
        lines.append(f"  {name:<28} {value / 1e9:10.2f} GB per step")
    lines += [
        f"  step time            {est.step_s:8.3f} s   tok/s per GPU {est.tok_per_s_gpu:,.0f}   MFU {est.mfu:.1%}",
        f"  max_duration         {duration(est)}",
    ]
    return lines


def report(cfg, recipe: str, nodes: int, gpus_per_node: int, gpu: str, propose: bool = True) -> str:
    kind = GPUS[gpu]
    planner = Planner(cfg, nodes, gpus_per_node, kind)
    base = planner.estimate(recipe_choice(cfg))
    lines = [f"{recipe}: {planner.n_params / 1e9:.2f}B parameters, {nodes} x {gpus_per_node} {kind.name}"]
    lines += table(base, kind.name)
    if cfg.precision == "amp_fp8":
        lines.append(f"  note: {FLOAT8_NOTE}")
    if propose:
        found = proposals(planner, base)
        lines.append("proposals:" if found else "proposals: none (no single change checked fits or is faster)")
        for change, est in found:
            lines.append(f"  {change}: peak {gib(est.peak).strip()} ({'fits' if est.fits else 'does not fit'}), "
                         f"step {est.step_s:.3f} s, MFU {est.mfu:.1%}")
    return "\n".join(lines)
