"""Marks the modules of the MPT blocks that ``model.activation_checkpointing_target`` selects (its meaning:
models/mpt/act_ckpt_target.py) with ``_activation_checkpointing = True`` (Composer's convention), which
``train/parallel.py`` reads."""

from __future__ import annotations

from typing import Any

from torch import nn

from llmfoundry.models.layers.attention import Attention
from llmfoundry.models.layers.ffn import MPTGLU, MPTMLP
from llmfoundry.models.layers.norm import LayerNorm, RMSNorm
from llmfoundry.models.mpt.act_ckpt_target import parse_target


def _names_of(module: nn.Module, is_block: bool, attn_type: str) -> set[str]:
    """The target names that ``module`` (inside a block) answers to, following llm-foundry's class hierarchy."""
    if is_block:
        return {"mptblock"}
    if isinstance(module, Attention):
        return {"grouped_query_attention", attn_type}
    if isinstance(module, MPTGLU):
        return {"mptmlp", "mptglu"}
    if isinstance(module, MPTMLP):
        return {"mptmlp"}
    for cls, base in ((LayerNorm, "layernorm"), (RMSNorm, "rmsnorm")):
        if isinstance(module, cls):
            return {base, f"low_precision_{base}"} if module.low_precision else {base}
    return set()


def mark_checkpointed(blocks: list[nn.Module], target: Any, attn_type: str) -> list[nn.Module]:
    """Mark (``_activation_checkpointing``) and return the modules ``target`` selects in ``blocks``."""
    mapping = parse_target(target, len(blocks))
    chosen = []
    for idx, block in enumerate(blocks):
        for module in block.modules():
            names = _names_of(module, module is block, attn_type)
            match = next(((name, ids) for name, ids in mapping if name in names), None)
            selected = match is not None and (match[1] is None or idx in match[1])
            module._activation_checkpointing = selected
            if selected:
                chosen.append(module)
    return chosen
