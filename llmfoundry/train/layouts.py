"""The 2-D meshes of tensor and expert parallelism, and the checks of a layout against the world size and
``fsdp_config``. How a model's blocks and experts split is the model's own plan (``ModelHooks.tensor_parallel`` /
``expert_parallel``; MPT's: models/mpt/tensor_parallel.py, models/mpt/expert_parallel.py); parallel.py applies it.

Tensor parallelism (``tp_config``): a ``(dp, tp)`` mesh, ``tp = tensor_parallel_degree`` consecutive ranks per TP
group (one node's fast links), ``dp = world / tp`` groups. The ranks of one TP group compute on the same
microbatch: the data loaders deal batches by data-parallel rank (the trainer's ``core.dist.DataShare``, which it
hands to the loaders and the ICL evaluator), and the global batch splits across ``dp`` ranks, not ``world``.
Gradients then live on several meshes (blocks: (dp, tp); the rest: dp under FSDP2, plain tensors without it),
which torch's ``get_total_norm`` / ``clip_grads_with_norm_`` refuse in one foreach call: gradient clipping
(train/algorithms.py) works per mesh.

Expert parallelism (``model.ffn_config.moe_world_size``): an ``(edp, ep)`` mesh, ``ep`` consecutive ranks sharing
one set of experts; FSDP2 shards the experts over ``edp`` and everything else over all ranks.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.interface import ExpertParallelPlan, TensorParallelPlan, hooks_of
from llmfoundry.train.settings import FSDPConfig, TPConfig

# Sharding strategies of fsdp_config that FSDP2 applies over one (dp) mesh dimension next to TP
FSDP_WITH_TP = ("FULL_SHARD", "SHARD_GRAD_OP")


def check_tensor_parallel(model: nn.Module, tp: TPConfig, fsdp: FSDPConfig | None,
                          world_size: int) -> TensorParallelPlan:
    """The model's tensor-parallel plan, once the layout is one it can run; otherwise a one-line ConfigError."""
    degree = tp.tensor_parallel_degree
    if world_size % degree:
        raise ConfigError(f"tp_config.tensor_parallel_degree: {degree} does not divide the world size {world_size} "
                          f"(use a divisor of it)")
    plan = hooks_of(model).tensor_parallel
    if plan is None:
        raise ConfigError(f"tp_config: {type(model).__name__} declares no tensor-parallel plan (of the built-in "
                          "models only MPT has one): remove tp_config, or use model.name: mpt_causal_lm")
    plan.check(degree, tp.strategy)
    if world_size // degree > 1 and fsdp is None:
        raise ConfigError(f"tp_config: {world_size // degree} data-parallel groups need fsdp_config (FSDP2 across "
                          f"TP groups; DDP does not take tensor-parallel parameters)")
    if fsdp is not None and world_size // degree > 1 and fsdp.sharding_strategy not in FSDP_WITH_TP:
        raise ConfigError(f"tp_config: fsdp_config.sharding_strategy: {fsdp.sharding_strategy} with tensor "
                          f"parallelism is not supported (use {' or '.join(FSDP_WITH_TP)})")
    return plan


def tp_mesh(device_type: str, tp: TPConfig, world_size: int) -> DeviceMesh:
    """The 2-D (dp, tp) mesh: TP groups of consecutive ranks."""
    degree = tp.tensor_parallel_degree
    return init_device_mesh(device_type, (world_size // degree, degree), mesh_dim_names=("dp", "tp"))


def expert_parallel_plan(model: nn.Module) -> ExpertParallelPlan | None:
    """The model's expert-parallel plan when it splits its experts over more than one rank, else None."""
    plan = hooks_of(model).expert_parallel
    return plan if plan is not None and plan.degree > 1 else None


def check_expert_parallel(degree: int, fsdp: FSDPConfig | None, world_size: int, tensor_parallel: bool) -> None:
    """One-line ConfigErrors for layouts this code does not run."""
    key = "model.ffn_config.moe_world_size"
    if world_size % degree:
        raise ConfigError(f"{key}: {degree} does not divide the world size {world_size} (use a divisor of it)")
    if fsdp is None:
        raise ConfigError(f"{key}: expert parallelism needs fsdp_config (FSDP2 shards the experts across the "
                          f"expert-parallel groups; DDP does not take sharded parameters)")
    if tensor_parallel:
        raise ConfigError(f"{key}: expert parallelism together with tp_config is not supported (set one of them)")


def ep_mesh(device_type: str, degree: int, world_size: int) -> DeviceMesh:
    """The 2-D (edp, ep) mesh: expert-parallel groups of consecutive ranks."""
    return init_device_mesh(device_type, (world_size // degree, degree), mesh_dim_names=("edp", "ep"))
