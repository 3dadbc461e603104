"""docs/plan-table.md's two tables: every yamls/mpt/*.yaml planned at its intended scale, and llm-foundry's published
H100 throughput rows (seq 2048) planned with their settings, beside their measured MFU and tok/s per GPU.

Each row is the estimate `llmfoundry plan RECIPE [overrides] --nodes N --gpus-per-node G --gpu KIND` prints for the
recipe's own choice (llmfoundry/train/plan.py's Planner.estimate of recipe_choice; no proposals). A recipe whose
model cannot be measured on fake tensors shows plan's one-line error instead of numbers. The tables replace
what lies between the ``<!-- plan_table:NAME -->`` and ``<!-- /plan_table:NAME -->`` lines of docs/plan-table.md.

    python benchmarks/plan_table.py [--check]    # ~3 minutes on 2 cores; --check: fail if the doc is stale
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs/plan-table.md"


@dataclass(frozen=True)
class Run:
    recipe: str  # under yamls/mpt/
    gpus: int
    overrides: tuple[str, ...] = ()
    gpu: str = "h100"

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // 8)

    @property
    def gpus_per_node(self) -> int:
        return min(8, self.gpus)


# the recipes at the scale they are written for (a recipe's header names 8 GPUs for one node; the larger ones are
# the scales issue #32 names: 30B on 64, 70B on 256 and 512; 13B on 16)
SCALE = [Run("125m", 8), Run("350m", 8), Run("760m", 8), Run("1b", 8), Run("3b", 8), Run("7b", 8), Run("7b-tp", 8),
         Run("13b", 16), Run("30b", 64), Run("70b", 256), Run("70b", 512), Run("moe-small", 8), Run("moe-dbrx", 64)]


@dataclass(frozen=True)
class Published:
    """One row of llm-foundry's scripts/train/benchmarking/README.md (commit 061f2c7c), seq len 2048, amp_bf16,
    mixed precision DEFAULT (bf16 compute, fp32 gradient reduction), FULL_SHARD."""

    model: str
    gpus: int
    micro: int
    accum: int
    batch: int  # global, samples
    checkpointing: bool
    mfu: float  # percent
    tok_s_gpu: int
    gpu: str = "h100"

    def run(self) -> Run:
        return Run(self.model, self.gpus, (f"global_train_batch_size={self.batch}",
                                           f"device_train_microbatch_size={self.micro}",
                                           f"fsdp_config.activation_checkpointing={str(self.checkpointing).lower()}",
                                           "fsdp_config.mixed_precision=DEFAULT"), self.gpu)


# their "H100 80GB BF16" table at seq len 2048 (125m and 350m are only in their "A100 80GB" table: planned on a100)
PUBLISHED = [
    Published("125m", 8, 32, 2, 512, False, 44.45, 141737, "a100"),
    Published("350m", 8, 32, 2, 512, False, 51.62, 58782, "a100"),
    Published("760m", 8, 24, 2, 384, False, 34.9, 63147),
    Published("1b", 8, 14, 1, 112, False, 41.82, 45455),
    Published("3b", 16, 10, 3, 480, False, 43.73, 24142),
    Published("7b", 8, 6, 1, 48, False, 46.44, 10643),
    Published("13b", 8, 2, 1, 16, False, 39.79, 4792),
    Published("13b", 16, 2, 1, 32, False, 39.58, 4767),
    Published("30b", 8, 3, 21, 504, True, 38.11, 2002),
    Published("30b", 32, 14, 3, 1344, True, 43.92, 2308),
    Published("70b", 64, 8, 4, 2048, True, 42.57, 1039),
]


def plan(run: Run, shared: dict):
    """(planner, estimate) or the one-line error plan prints; ``shared``: measurements per recipe (the overrides
    here change batch sizes, checkpointing and mixed precision only: the fake runs are keyed by all three)."""
    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.plan import Planner, recipe_choice
    from llmfoundry.train.plan_hardware import GPUS
    from llmfoundry.train.recipe import load_train_config

    try:
        cfg, _ = load_train_config(str(REPO / f"yamls/mpt/{run.recipe}.yaml"), list(run.overrides))
        planner = Planner(cfg, run.nodes, run.gpus_per_node, GPUS[run.gpu], shared.setdefault(run.recipe, {}))
        return planner, planner.estimate(recipe_choice(cfg))
    except ConfigError as error:
        return None, str(error)


def gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


def scale_table(shared: dict) -> str:
    lines = ["| recipe | GPUs (H100) | params | microbatch x accum, ckpt | peak GiB per GPU (of 80) | step s | MFU "
             "| tok/s per GPU | max_duration | days | GPU-hours |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in SCALE:
        planner, est = plan(run, shared)
        name = f"`{run.recipe}.yaml`"
        if planner is None:
            lines.append(f"| {name} | {run.gpus} | | | {est} | | | | | | |")
            continue
        c = est.choice
        accum = -(-planner.device_batch // c.micro)
        fits = "" if est.fits else " (does not fit)"
        hours = est.hours()
        days = "" if hours is None else f"{hours / 24:.1f}"
        gpu_hours = "" if hours is None else f"{hours * est.world:,.0f}"
        duration = "epochs" if est.steps is None else f"{est.steps:,} ba"
        lines.append(f"| {name} | {run.gpus} | {planner.n_params / 1e9:.2f}B | {c.micro} x {accum}, "
                     f"{c.checkpointing or 'off'} | {gib(est.peak)}{fits} | {est.step_s:.2f} | "
                     f"{est.mfu:.1%} | {est.tok_per_s_gpu:,.0f} | {duration} | {days} | {gpu_hours} |")
    return "\n".join(lines)


def published_table(shared: dict) -> str:
    lines = ["| model | GPUs | micro x accum, global batch, ckpt | llm-foundry MFU | plan MFU | llm-foundry tok/s "
             "per GPU | plan tok/s per GPU | plan / measured | plan peak GiB per GPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in PUBLISHED:
        planner, est = plan(row.run(), shared)
        where = f"{row.gpus} {row.gpu.upper()}"
        settings = f"{row.micro} x {row.accum}, {row.batch}, {'on' if row.checkpointing else 'off'}"
        if planner is None:
            lines.append(f"| {row.model} | {where} | {settings} | {row.mfu:.1f}% | {est} | {row.tok_s_gpu:,} | | | |")
            continue
        lines.append(f"| {row.model} | {where} | {settings} | {row.mfu:.1f}% | {est.mfu:.1%} | {row.tok_s_gpu:,} | "
                     f"{est.tok_per_s_gpu:,.0f} | {est.tok_per_s_gpu / row.tok_s_gpu:.2f} | {gib(est.peak)} |")
    return "\n".join(lines)


def replace_block(text: str, name: str, table: str) -> str:
    pattern = re.compile(rf"(<!-- plan_table:{name} -->\n).*?(<!-- /plan_table:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no '<!-- plan_table:{name} -->' ... '<!-- /plan_table:{name} -->' block")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/plan-table.md differs")
    args = parser.parse_args()
    start = time.perf_counter()
    shared: dict = {}
    text = DOC.read_text()
    new = replace_block(replace_block(text, "scale", scale_table(shared)), "published", published_table(shared))
    print(f"planned {len(SCALE) + len(PUBLISHED)} runs in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run python benchmarks/plan_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
