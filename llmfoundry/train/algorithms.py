"""Training algorithms by name (llm-foundry's `algorithms:` section).

gradient_clipping follows Composer's: norm (the global norm), value (each element) and adaptive (AGC: each
unit, i.e. each output row of a weight or a whole bias, is scaled so that its gradient norm is at most
clipping_threshold times its weight norm). Composer's model-surgery algorithms (alibi, gated_linear_units,
low_precision_layernorm) are model keys here, so naming them is an error that says which key to set.

The names are declared in train/catalog.py and their settings live in train/algorithm_settings.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.algorithm_settings import GradientClippingSettings


class GradientClipping:
    """Clips gradients after they are accumulated and before the optimizer step."""

    def __init__(self, settings: GradientClippingSettings):
        self.settings = settings

    def clip(self, model: torch.nn.Module) -> torch.Tensor | None:
        params = [p for p in model.parameters() if p.grad is not None]
        kind, threshold = self.settings.clipping_type, self.settings.clipping_threshold
        if kind == "adaptive":
            for p in params:
                clip_adaptive_(p, threshold)
            return None
        sharded = any(isinstance(p.grad, DTensor) for p in params)
        if kind == "value" and not sharded:
            torch.nn.utils.clip_grad_value_(params, threshold)
            return None
        # norm; and value under FSDP, where Composer scales all gradients so that the largest magnitude is at most
        # the threshold (FSDP's clip_grad_norm_ with the inf-norm) instead of clamping each element
        by_mesh = _by_mesh(params)
        total = total_norm([[p.grad for p in group] for group in by_mesh], 2.0 if kind == "norm" else math.inf)
        for group in by_mesh:
            torch.nn.utils.clip_grads_with_norm_(group, threshold, total)
        return total if kind == "norm" else None


def _by_mesh(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters grouped by the device mesh of their gradient (None: plain tensors). Tensor parallelism puts the
    blocks on a (dp, tp) mesh and the rest on dp (or nowhere), and torch's foreach norm and clip refuse a mix."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    return list(groups.values())


def total_norm(grad_groups: list[list[torch.Tensor]], norm_type: float) -> torch.Tensor:
    """The norm of all gradients together, as a plain tensor: each group's (a DTensor's partial norm reduced over
    its mesh), then combined."""
    norms = []
    for grads in grad_groups:
        norm = torch.nn.utils.get_total_norm(grads, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.zeros(())
    if len(norms) == 1:
        return norms[0]
    stacked = torch.stack([n.to(norms[0].device) for n in norms])
    return stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)


def _unit_norms(t: torch.Tensor) -> torch.Tensor:
    """AGC's unit-wise norm: a scalar or vector is one unit; a matrix (or more) has one unit per output row."""
    if t.ndim <= 1:
        return torch.linalg.vector_norm(t)
    return torch.linalg.vector_norm(t, dim=tuple(range(1, t.ndim)), keepdim=True)


@torch.no_grad()
def clip_adaptive_(param: torch.Tensor, threshold: float) -> None:
    """Scale each unit's gradient by min(1, threshold * |w_unit| / |g_unit|) (1 where both norms are 0), in place.

    FSDP2 shards parameters by rows (dim 0), so a matrix's units are whole on each rank and its norms are local;
    a vector's single unit spans ranks, so its two norms are reduced over the mesh first.
    """
    weight, grad = param.detach(), param.grad
    if isinstance(grad, DTensor):
        # rows stay whole under any split of dim 0: FSDP2's Shard(0), and its _StridedShard(0) over the experts
        # that expert parallelism split first (no is_shard() for that one: its dim says it)
        if any(not (pl.is_replicate() or getattr(pl, "dim", None) == 0) for pl in grad.placements):
            raise ConfigError(f"algorithms.gradient_clipping.clipping_type: adaptive needs whole output rows per rank, "
                              f"got the sharding {grad.placements} (tensor parallelism: use norm or value)")
        if weight.ndim <= 1:
            w_norm = torch.linalg.vector_norm(weight).full_tensor()
            g_norm = torch.linalg.vector_norm(grad).full_tensor()
        weight, grad = weight.to_local(), grad.to_local()
        if weight.ndim > 1:
            w_norm, g_norm = _unit_norms(weight), _unit_norms(grad)
    else:
        w_norm, g_norm = _unit_norms(weight), _unit_norms(grad)
    coeff = (w_norm * threshold / g_norm).nan_to_num_(nan=1.0).clamp_(max=1.0)
    grad.mul_(coeff.to(grad.dtype))


def build_gradient_clipping(settings: GradientClippingSettings) -> GradientClipping:
    return GradientClipping(settings)


def _refuse(settings: Any):
    raise ValueError("model-surgery algorithms are refused when the recipe is validated")
