"""The mixture-of-experts keys of ``model.ffn_config``: which ffn_types are MoE, MegaBlocks' defaults, and the
consistency checks of the recipe schema. Apart from the MoE layer (layers/moe.py) so that checking a recipe does
not import torch."""

from __future__ import annotations

from typing import Any

MOE_TYPES = ("mb_moe", "mb_dmoe", "torch_dmoe")
MEGABLOCKS_TYPES = ("mb_moe", "mb_dmoe")
# MegaBlocks' defaults (megablocks.layers.arguments.Arguments), which llm-foundry's mb_moe/mb_dmoe inherit
MEGABLOCKS_LOSS_WEIGHT = 0.1
MEGABLOCKS_ACT_FN = {"name": "gelu", "approximate": "tanh"}
# (key, value meaning "unset"): MoE keys a dense ffn_type must not set
MOE_KEYS = (("moe_num_experts", 1), ("moe_top_k", 1), ("moe_jitter_eps", None), ("moe_normalize_expert_weights", None),
            ("moe_loss_weight", None), ("moe_lbl_in_fp32", False), ("moe_weight_parallelism", False),
            ("moe_world_size", 1), ("uniform_expert_assignment", False), ("mlp_type", "mlp"),
            ("mlp_impl", "sparse"), ("memory_optimized_mlp", False))  # fmt: skip


def is_moe(ffn_type: str) -> bool:
    return ffn_type in MOE_TYPES


def loss_weight(ffn_config: Any) -> float:
    """The weight of the load-balancing loss in the training loss: moe_loss_weight, else MegaBlocks' 0.1 for
    mb_moe/mb_dmoe and 0 for torch_dmoe (llm-foundry's torch_dmoe adds no load-balancing loss)."""
    if ffn_config.moe_loss_weight is not None:
        return float(ffn_config.moe_loss_weight)
    return MEGABLOCKS_LOSS_WEIGHT if ffn_config.ffn_type in MEGABLOCKS_TYPES else 0.0


def moe_problems(f: Any, p: str) -> list[str]:
    """The inconsistent MoE keys of ``model.ffn_config`` (``p`` is its path), one message each."""
    if not is_moe(f.ffn_type):
        return [f"{p}.{key}: only used with ffn_type {', '.join(MOE_TYPES)} (ffn_type is {f.ffn_type}); remove it"
                for key, unset in MOE_KEYS if getattr(f, key) != unset]
    problems = []
    if f.moe_num_experts < 1:
        problems.append(f"{p}.moe_num_experts: at least 1, got {f.moe_num_experts}")
    elif not 1 <= f.moe_top_k <= f.moe_num_experts:
        problems.append(f"{p}.moe_top_k: between 1 and moe_num_experts={f.moe_num_experts}, got {f.moe_top_k}")
    if f.moe_jitter_eps is not None and not 0.0 <= f.moe_jitter_eps < 1.0:
        problems.append(f"{p}.moe_jitter_eps: in [0, 1) (inputs are scaled by U(1 - eps, 1 + eps)), "
                        f"got {f.moe_jitter_eps}")
    norm = f.moe_normalize_expert_weights
    if norm is not None and (isinstance(norm, bool) or norm <= 0):
        problems.append(f"{p}.moe_normalize_expert_weights: a p-norm order > 0 (e.g. 1: weights sum to 1), "
                        f"got {norm!r}")
    if f.moe_loss_weight is not None and f.moe_loss_weight < 0:
        problems.append(f"{p}.moe_loss_weight: at least 0, got {f.moe_loss_weight}")
    if f.moe_world_size < 1 or f.moe_num_experts % f.moe_world_size:
        problems.append(f"{p}.moe_world_size: the ranks sharing the experts must divide moe_num_experts="
                        f"{f.moe_num_experts} (each rank keeps as many), got {f.moe_world_size}")
    if f.ffn_type == "mb_moe" and f.mlp_type == "glu":
        problems.append(f"{p}.mlp_type: glu with ffn_type mb_moe: MegaBlocks' mb_moe builds MLP experts whatever "
                        "mlp_type says, so llm-foundry trains MLPs from this recipe; set mlp_type: mlp, or ffn_type: "
                        "mb_dmoe for GLU experts")
    if f.moe_weight_parallelism:
        problems.append(f"{p}.moe_weight_parallelism: expert weight parallelism is not implemented yet (#15); set it "
                        "to false (FSDP shards the experts' weights like any other)")
    return problems
