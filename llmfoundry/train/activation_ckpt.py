"""Activation checkpointing of the modules a model declares (its blocks, or MPT's activation_checkpointing_target):
``fsdp_config.activation_checkpointing_mode`` chooses how much of their forward is recomputed in backward.

* ``full``: each module's whole forward is recomputed (only its inputs are kept); llm-foundry's behaviour.
* ``selective_op``: torchtitan's per-op policy. Inside each module, the outputs of matmuls, attention kernels and
  float8 matmuls are saved, except every second matmul (counted separately in forward and in recompute, so both
  passes make the same choice); everything else (norms, activations, pointwise ops, the other matmuls) is
  recomputed. That keeps most of the expensive work out of the recompute while freeing most of the memory.
* ``selective_layer_N``: every Nth module is checkpointed in full (the Nth, 2Nth, ... as torchtitan counts them),
  the others keep all their activations.

Recomputation replays the same ops on the same inputs, so losses and gradients match the uncheckpointed run.
"""

from __future__ import annotations

import collections
import functools

import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts,
                                    noop_context_fn)

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.settings import parse_checkpointing_mode

_aten = torch.ops.aten
# the matmuls "every other" counts: nn.Linear lowers to mm (no bias) or addmm (bias)
MATMULS = frozenset({_aten.mm.default, _aten.addmm.default})


def _ops(*names: str) -> frozenset:
    """The default overloads of the aten ops among ``names`` that this torch has (some are CUDA or version only)."""
    return frozenset(getattr(_aten, name).default for name in names if hasattr(_aten, name))


# outputs always kept: attention kernels (flash, memory-efficient, cuDNN, the CPU flash) and float8's scaled matmul;
# each is far costlier to recompute than to hold
ALWAYS_SAVED = MATMULS | _ops(
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_mm",
)
if hasattr(torch.ops.higher_order, "flex_attention"):  # FlexAttention (packed documents, ALiBi on CUDA) too
    ALWAYS_SAVED |= {torch.ops.higher_order.flex_attention}
if hasattr(torch.ops, "_c10d_functional"):  # a tensor-parallel reduce-scatter: a collective is not recomputed
    ALWAYS_SAVED |= {torch.ops._c10d_functional.reduce_scatter_tensor.default}


def _op_policy():
    """A fresh (forward, recompute) context pair per checkpointed call: the matmul counters start at zero in each."""
    counts: collections.Counter = collections.Counter()

    def policy(ctx, op, *args, **kwargs):
        if op not in ALWAYS_SAVED:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if op in MATMULS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 0:  # every second matmul is recomputed, the others saved
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(module: nn.Module, reentrant: bool, selective_op: bool = False) -> None:
    """Recompute ``module``'s forward during backward (``selective_op``: only what the per-op policy does not save).
    Parameter names are unchanged (the forward is replaced, no wrapper module)."""
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if reentrant and not selective_op:
            if kwargs:
                raise ValueError("activation_checkpointing_reentrant: the block takes keyword arguments; "
                                 "set activation_checkpointing_reentrant: false")
            return checkpoint(forward, *args, use_reentrant=True)
        policy = _op_policy if selective_op else noop_context_fn
        return checkpoint(forward, *args, use_reentrant=False, context_fn=policy, **kwargs)

    module.forward = checkpointed


def checkpoint_modules(targets: list[nn.Module], mode: str, reentrant: bool) -> list[nn.Module]:
    """Apply ``fsdp_config.activation_checkpointing_mode`` to ``targets`` (in model order); the modules changed."""
    kind, every = parse_checkpointing_mode(mode)
    if kind == "selective_op" and reentrant:  # the per-op policy lives in the non-reentrant implementation only
        raise ConfigError("fsdp_config.activation_checkpointing_reentrant: true cannot apply a per-op policy "
                          "(set it to false, or activation_checkpointing_mode: full)")
    chosen = [m for i, m in enumerate(targets) if kind != "selective_layer" or (i + 1) % every == 0]
    for module in chosen:
        apply_activation_checkpointing(module, reentrant, selective_op=kind == "selective_op")
    return chosen
