"""The scale of the optimizer moments in an llm-foundry (Composer) checkpoint, relative to the gradients our trainer
computes: the rule, from Composer's and torch's code and from benchmarks/composer_moment_scale.py's experiments.

Composer scales each microbatch's loss by its share of the rank's batch (samples, or loss-generating tokens with
``accumulate_train_batch_on_tokens``, normalised by the average over ranks), so every rank's gradient is a mean,
as ours is. What differs is how the ranks' gradients are combined:

- one process, DDP, FSDP1 (any sharding strategy): averaged (FSDP1 sums with pre- and post-division factors; DDP
  sums and divides) -> moments at our scale, factor 1;
- FSDP2 (Composer picks it with ``FSDP_VERSION=2``; ``sharding_strategy`` is ignored, so the mesh is one
  dimension over all ranks): ``fully_shard`` reduce-scatters float32/bfloat16 gradients with ``ReduceOp.AVG``.
  NCCL averages. torch 2.7's gloo backend (``device: cpu``) ignores the op of ``reduce_scatter_tensor`` and sums,
  so those gradients were ``world_size`` times ours: ``exp_avg`` carries a factor of ``world_size`` and
  ``exp_avg_sq`` its square. Adam's update is nearly scale-free, so llm-foundry's own runs and resumes never show
  it; mixed with our gradients after a resume, the moments move the weights differently from the next batch on.

What a checkpoint records: ``state.metadata`` (world_size, device, torch_version), not the FSDP version. A
sharded checkpoint shows it in its layout (``fsdp_version_from_order``): FSDP1's optimizer state dict lists the
parameters in sorted name order, FSDP2's in the model's parameter order. Where that says nothing (a model whose
parameter order is sorted, a monolithic file written by several CPU ranks), FSDP1 is assumed, with a notice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

# torch releases whose gloo reduce_scatter_tensor sums whatever op it is given (measured: 2.7.0 sums, 2.13.0
# averages; Composer releases that write checkpoints pin torch <= 2.7). Versions in between are not measured.
GLOO_SUMS_UP_TO = (2, 7)
GLOO_AVERAGES_FROM = (2, 13)
# The optimizer state that is a running mean of gradients (power 1) or of their squares (power 2).
MOMENT_POWERS = {"exp_avg": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 2}


@dataclass(frozen=True)
class MomentScale:
    factor: float  # the checkpoint's gradients were this many times ours
    reason: str  # one line: what was read from the checkpoint and what it means
    assumed: bool = False  # the factor rests on an assumption (said in a notice)

    def rescale(self, state_name: str, value: Any) -> Any:
        """``value`` (a state tensor named ``state_name``) at our trainer's gradient scale."""
        power = MOMENT_POWERS.get(state_name)
        if self.factor == 1 or power is None or not isinstance(value, torch.Tensor):
            return value
        return value / self.factor ** power


def _torch_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def fsdp_version_from_order(model_names: list[str], optimizer_names: list[str]) -> int | None:
    """1 or 2 from the order of a sharded checkpoint's optimizer state (see the module's docstring); None when the
    order says nothing (the parameters' own order is sorted) or matches neither."""
    trained = set(optimizer_names)
    in_model_order = [name for name in model_names if name in trained]
    known = set(in_model_order)
    listed = [name for name in optimizer_names if name in known]
    if len(listed) < 2 or in_model_order == sorted(in_model_order):
        return None
    if listed == in_model_order:
        return 2
    return 1 if listed == sorted(listed) else None


def moment_scale(metadata: dict[str, Any], fsdp_version: int | None, clipped: bool = False) -> MomentScale:
    """The factor for a checkpoint whose ``state.metadata`` is ``metadata``; ``fsdp_version``: 1 or 2 when the
    checkpoint shows it, None when not; ``clipped``: Composer's GradientClipping ran (see ``_clipping``)."""
    return _clipping(_scale(metadata, fsdp_version), clipped)


def _clipping(scale: MomentScale, clipped: bool) -> MomentScale:
    """Clipping acted on the summed gradients: a step whose summed gradient's norm exceeded the threshold was cut to
    the same norm ours would have (factor 1), a step under it kept the whole factor, steps between something in
    between. The checkpoint does not say which steps were clipped, so the factor is an assumption then."""
    if not clipped or scale.factor == 1:
        return scale
    return MomentScale(scale.factor, f"{scale.reason}; gradient clipping was on, so steps clipped there carried a "
                                     f"smaller factor (down to 1): {scale.factor:g} assumed, exact where no step "
                                     "was clipped", assumed=True)


def _scale(metadata: dict[str, Any], fsdp_version: int | None) -> MomentScale:
    world = int(metadata.get("world_size") or 1)
    device = str(metadata.get("device") or "")
    version = _torch_version(str(metadata.get("torch_version") or ""))
    if world == 1:
        return MomentScale(1, "written by one process")
    if device != "cpu":
        return MomentScale(1, f"written on {device or 'an unrecorded device'} (NCCL averages the ranks' gradients)")
    if version is not None and version >= GLOO_AVERAGES_FROM:
        return MomentScale(1, f"written on CPU by torch {metadata.get('torch_version')}, whose gloo averages")
    if fsdp_version == 1:
        return MomentScale(1, "written by FSDP1 (optimizer state in sorted order), which averages the ranks' "
                              "gradients")
    if fsdp_version == 2:
        if version is None or version > GLOO_SUMS_UP_TO:
            return MomentScale(world, f"written by FSDP2 on CPU by torch {metadata.get('torch_version')}: assumed to "
                                      f"sum the {world} ranks' gradients as torch 2.7's gloo does (no torch between "
                                      "2.7 and 2.13 was measured)", assumed=True)
        return MomentScale(world, f"written by FSDP2 (optimizer state in parameter order) on CPU by torch "
                                  f"{metadata.get('torch_version')}, whose gloo summed the {world} ranks' gradients")
    return MomentScale(1, f"written by {world} ranks on CPU by torch {metadata.get('torch_version')}, and the "
                          "checkpoint does not show whether FSDP1 or FSDP2 made it: assumed FSDP1 (Composer's "
                          "default), whose moments need no change; had that run set FSDP_VERSION=2, they are "
                          f"{world}x (exp_avg) and {world * world}x (exp_avg_sq) ours", assumed=True)
