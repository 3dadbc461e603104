"""Parallelism applied from outside the model: activation checkpointing, torch.compile, FSDP2 or DDP.

Order: float8 conversion of the Linears (``precision: amp_fp8``, train/float8.py) -> activation checkpointing
(train/activation_ckpt.py) -> torch.compile (each block, or the whole model with ``compile_config.scope: model``)
-> ``fully_shard`` per block, then the root. Models expose their transformer blocks through ``model.blocks()``
(the CausalLM protocol); a model whose list is empty is compiled and sharded as one unit.

``fsdp_config`` maps onto FSDP2 like this:

=====================  ==================================================================================
FULL_SHARD             ``fully_shard(block, reshard_after_forward=True)`` on a 1-D mesh of all ranks
SHARD_GRAD_OP          ``reshard_after_forward=False`` (parameters stay gathered until backward)
HYBRID_SHARD           2-D mesh (replicate, shard): shard within data_parallel_shard_degree ranks (one node)
_HYBRID_SHARD_ZERO2    HYBRID_SHARD with ``reshard_after_forward=False``
NO_SHARD               2-D mesh (world, 1): every rank holds everything, gradients are all-reduced
mixed_precision        ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` (a mapping's keys and dtype names are
                       checked when the recipe is validated, see settings.FSDPConfig)
cpu_offload            ``CPUOffloadPolicy()``
auto_wrap              false: only the root is sharded (no per-block ``fully_shard``)
forward_prefetch       ``set_modules_to_forward_prefetch`` of the next ``forward_prefetch_limit`` blocks
backward_prefetch      BACKWARD_PRE = FSDP2's own prefetch; with ``backward_prefetch_limit`` > 1 also
                       ``set_modules_to_backward_prefetch`` of that many earlier blocks. BACKWARD_POST / NONE: a notice
sync_module_states     rank 0's parameters and buffers are broadcast before sharding (a meta-device model is
                       materialised from the seed on every rank, identical by construction)
activation_checkpointing  the modules the model builder marked (``_activation_checkpointing``, e.g. MPT's
                       ``model.activation_checkpointing_target``), else every block; how much of each is
                       recomputed: ``activation_checkpointing_mode`` (full, selective_op, selective_layer_N)
limit_all_gathers, use_orig_params, load_monolith_rank0_only, verbose, activation_checkpointing_fn: FSDP1
knobs with no FSDP2 meaning; set to a non-default value they are accepted with a one-line notice
=====================  ==================================================================================

A model built on the meta device (``init_device: meta``) is materialised block by block: each block is allocated and
initialised with the model's per-module initialiser (``_init_weights``; the same values on every rank, from the
seed) and sharded right away, so a rank holds its shards plus at most one full block. With tensor or expert
parallelism the block is split over the TP / EP ranks before FSDP2 shards it, in the same walk. The modules are
visited in ``model.modules()`` order, the order ``init_parameters()`` uses, so every layout starts from the values a
one-rank meta run would have. Models without a per-module initialiser are sharded first, then ``to_empty`` +
``init_parameters()`` run on the shards.

A meta model built from a pretrained folder (``init_device: meta | mixed``; the builder attaches a
``models.pretrained_weights.PretrainedWeights``) initialises only what the folder lacks (rotary tables, new LoRA
adapters); the tensors the folder holds stay on meta through sharding, then each rank allocates its shards and
reads just those slices from the safetensors files. A node thus holds about one copy of the weights however many
ranks it runs; llm-foundry's ``mixed`` (rank 0 reads everything, ``sync_module_states`` broadcasts) gives the same
weights with a full copy on rank 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.precision import DTYPES, low_dtype
from llmfoundry.models.interface import hooks_of
from llmfoundry.models.pretrained_weights import PretrainedWeights
from llmfoundry.train import float8, layouts
from llmfoundry.train.activation_ckpt import checkpoint_modules
from llmfoundry.train.settings import CompileConfig, FSDPConfig, TPConfig

log = logging.getLogger(__name__)


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


# ----------------------------------------------------------------------------------------------- per block
def apply_compile(block: nn.Module, cfg: CompileConfig) -> None:
    kwargs: dict[str, Any] = {"backend": cfg.backend, "fullgraph": cfg.fullgraph, "dynamic": cfg.dynamic}
    if cfg.mode:
        kwargs["mode"] = cfg.mode
    if cfg.options:
        kwargs["options"] = dict(cfg.options)
    block.compile(**kwargs)


# ----------------------------------------------------------------------------------------------- FSDP2
def mixed_precision_policy(cfg: FSDPConfig, precision: str) -> MixedPrecisionPolicy:
    mp = cfg.mixed_precision
    if isinstance(mp, dict):  # its keys and dtype names were checked when the recipe was validated
        dtypes = {key: DTYPES[name] for key, name in mp.items()}
        # FSDP2 casts parameters, never buffers: buffer_dtype is accepted for llm-foundry recipes (documented).
        return MixedPrecisionPolicy(param_dtype=dtypes.get("param_dtype"), reduce_dtype=dtypes.get("reduce_dtype"))
    low = low_dtype(precision)
    if mp == "FULL" or low is None:
        return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    if mp == "PURE":
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)  # DEFAULT


def device_mesh(cfg: FSDPConfig, device: torch.device, world_size: int):
    """A 1-D mesh for FULL_SHARD / SHARD_GRAD_OP; a 2-D (replicate, shard) mesh for the hybrid strategies."""
    strategy = cfg.sharding_strategy
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return init_device_mesh(device.type, (world_size,))
    if strategy == "NO_SHARD":
        shard = 1
    else:
        shard = cfg.data_parallel_shard_degree
        if shard == -1:
            shard = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if cfg.data_parallel_replicate_degree != -1:
            replicate = cfg.data_parallel_replicate_degree
            if shard == -1 or replicate * shard != world_size:
                raise ConfigError(f"fsdp_config.data_parallel_replicate_degree: {replicate} x shard degree {shard} "
                                  f"!= world size {world_size} (make their product the number of ranks)")
    if shard < 1 or world_size % shard:
        raise ConfigError(f"fsdp_config.data_parallel_shard_degree: {shard} does not divide the world size "
                          f"{world_size} (use a divisor of it, or -1 for one node)")
    return init_device_mesh(device.type, (world_size // shard, shard), mesh_dim_names=("replicate", "shard"))


def apply_fsdp(model: nn.Module, cfg: FSDPConfig, precision: str, device: torch.device, world_size: int,
               seed: int = 0, mesh=None, experts_mesh=None, expert_modules: Callable[[nn.Module], list] = lambda b: [],
               prepare_block: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """fully_shard each block, then the root. A meta-device model whose class has a per-module initialiser
    (``_init_weights``) is materialised one block at a time just before that block is sharded, so a rank never
    holds more than its shards plus one full block; other meta models are initialised after sharding.
    ``mesh``: the data-parallel mesh (with tensor parallelism: the dp dimension); default from ``cfg``.
    ``experts_mesh``: with expert parallelism, the (edp, ep) mesh; each block's ``expert_modules(block)`` are
    sharded over edp first.
    ``prepare_block``: called on each block (materialised, not yet sharded) first: tensor or expert parallelism
    of that block, so that it too sees one whole block at a time."""
    reshard = cfg.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    if cfg.reshard_after_forward is not None:
        reshard = cfg.reshard_after_forward
    mesh = mesh if mesh is not None else device_mesh(cfg, device, world_size)
    kwargs = dict(mesh=mesh, mp_policy=mixed_precision_policy(cfg, precision),
                  offload_policy=CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy())
    blocks = model.blocks()

    def shard(i: int, block: nn.Module) -> None:
        if prepare_block is not None:
            prepare_block(block)
        for experts in expert_modules(block):  # before the block: over edp only
            fully_shard(experts, mesh=experts_mesh["edp"], mp_policy=kwargs["mp_policy"],
                        offload_policy=kwargs["offload_policy"])
        if cfg.auto_wrap:  # the last block's parameters are needed right away by backward: keep them gathered
            fully_shard(block, reshard_after_forward=reshard and i < len(blocks) - 1, **kwargs)

    files = each_block(model, blocks, device, seed, shard)
    fully_shard(model, reshard_after_forward=reshard, **kwargs)
    if files is not None:  # the tensors the files hold stayed on meta through sharding: allocate the shards, read them
        allocate_meta(model, "cpu" if cfg.cpu_offload else device)
        files.fill(model)
    if cfg.auto_wrap:
        set_prefetching(blocks, cfg)
    return model


def each_block(model: nn.Module, blocks: list[nn.Module], device: torch.device, seed: int,
               on_block: Callable[[int, nn.Module], None]) -> PretrainedWeights | None:
    """``on_block(i, block)`` for each block, in order (it parallelises and/or shards the block in place).

    A meta-device model with a per-module initialiser is materialised on the way, walking ``model.modules()``:
    a block in full just before ``on_block`` (which shards it, so its full tensors are freed), the other modules
    where they come. That is the order ``init_parameters()`` initialises a whole model in, so from the same seed
    the values are the same as materialising the whole model first, whatever the layout (one rank, FSDP, TP, EP).
    Tensors that pretrained files hold stay on meta; returns those files (to read into the shards afterwards),
    or None when nothing was left on meta for them."""
    init_module = hooks_of(model).init_module if is_meta(model) else None
    if init_module is None:  # nothing to materialise here (or no per-module initialiser: done on the shards)
        for i, block in enumerate(blocks):
            on_block(i, block)
        return None
    files = pretrained_files(model)
    provided = files.provided(model) if files is not None else set()
    index = {id(block): i for i, block in enumerate(blocks)}
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    done: set[int] = set()
    allocated: dict = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in list(model.modules()):  # a list: on_block may change the modules it walks through
            if id(module) in index:
                _materialize_modules(module.modules(), device, init_module, provided, allocated)
                on_block(index[id(module)], module)
                done.add(id(module))
            elif id(module) not in in_blocks:
                _materialize_modules([module], device, init_module, provided, allocated)
    missed = [i for i, block in enumerate(blocks) if id(block) not in done]
    if missed:  # blocks() names a module model.modules() does not reach (not a submodule): not expected
        raise ValueError(f"blocks() {missed} are not submodules of {type(model).__name__}")
    return files


def set_prefetching(blocks: list[nn.Module], cfg: FSDPConfig) -> None:
    """forward_prefetch / backward_prefetch(_limit) as FSDP2's explicit prefetching of neighbouring blocks."""
    if cfg.forward_prefetch:
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + cfg.forward_prefetch_limit])
    if cfg.backward_prefetch == "BACKWARD_PRE" and cfg.backward_prefetch_limit > 1:
        for i, block in enumerate(blocks[1:], start=1):
            block.set_modules_to_backward_prefetch(blocks[max(0, i - cfg.backward_prefetch_limit) : i][::-1])


# FSDP1 knobs without an FSDP2 counterpart: (key, value with which FSDP2 behaves the same, what FSDP2 does)
FSDP1_ONLY = (
    ("limit_all_gathers", True, "FSDP2 always limits in-flight all-gathers"),
    ("use_orig_params", True, "FSDP2 always exposes the original parameters"),
    ("load_monolith_rank0_only", False, "every rank reads the checkpoint it needs"),
    ("verbose", False, "nothing extra is printed"),
    ("activation_checkpointing_fn", None, "it has no effect in llm-foundry either; use "
     "model.activation_checkpointing_target to choose the checkpointed modules"),
)


def fsdp1_notices(cfg: FSDPConfig) -> None:
    """A one-line notice (once per run) for each FSDP1-only key set to a value FSDP2 cannot honour."""
    for key, same, what in FSDP1_ONLY:
        value = getattr(cfg, key)
        if value != same:
            notice_once(f"fsdp_config.{key}: {value!r} is an FSDP1 setting with no FSDP2 counterpart, ignored ({what})")
    if cfg.backward_prefetch != "BACKWARD_PRE":
        notice_once(f"fsdp_config.backward_prefetch: {cfg.backward_prefetch} has no FSDP2 counterpart, ignored "
                    "(FSDP2 prefetches each block's parameters before its backward, like BACKWARD_PRE)")


def checkpoint_targets(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The modules to recompute in backward: those the model declares (MPT: from
    ``model.activation_checkpointing_target``), else every block."""
    targets = hooks_of(model).checkpoint_targets
    return blocks if targets is None else targets


def broadcast_from_rank0(model: nn.Module) -> None:
    """sync_module_states: every rank takes rank 0's parameters and buffers (before sharding)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)


def _materialize_modules(modules, device: torch.device, init_module, provided: set[int] = frozenset(),
                         allocated: dict | None = None) -> None:
    """Allocate and initialise the modules with meta tensors, except those whose meta tensors all come from
    pretrained files (ids in ``provided``): they stay on meta, to be allocated (sharded) and read later."""
    allocated = {} if allocated is None else allocated
    for module in modules:
        own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        if any(t.is_meta and id(t) not in provided for t in own):
            _allocate_own(module, device, allocated)
            init_module(module)


def allocate_meta(model: nn.Module, device: torch.device | str) -> None:
    """Storage (uninitialised) for every meta tensor of ``model``, tied weights kept tied (unlike ``to_empty``)."""
    allocated: dict = {}
    for module in model.modules():
        _allocate_own(module, device, allocated)


def _allocate_own(module: nn.Module, device: torch.device | str, allocated: dict) -> None:
    """Storage for ``module``'s own meta tensors (FSDP2 shards stay shards). A tensor several modules share (tied
    embeddings) is allocated once and stays shared; ``to_empty`` would give each module a copy of its own.
    ``allocated``: id of a meta tensor -> (that tensor, kept so the id is not reused; a weak reference to its
    replacement). Weak: once a block is sharded its full tensors must be freed, not kept alive by this table."""
    for tensors in (module._parameters, module._buffers):
        for key, tensor in tensors.items():
            if tensor is None or not tensor.is_meta:
                continue
            entry = allocated.get(id(tensor))
            empty = entry[1]() if entry is not None else None
            if empty is None:
                empty = torch.empty_like(tensor, device=device)
                if isinstance(tensor, nn.Parameter):
                    empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
                allocated[id(tensor)] = (tensor, weakref.ref(empty))
            tensors[key] = empty


def pretrained_files(model: nn.Module) -> PretrainedWeights | None:
    """Where a meta-built model's pretrained weights are read from (declared by the model), or None."""
    return hooks_of(model).pretrained_weights


# ----------------------------------------------------------------------------------------------- entry point
def parallelize(model: nn.Module, *, fsdp: FSDPConfig | None, compile_cfg: CompileConfig | None, precision: str,
                device: torch.device, world_size: int, seed: int, tp: TPConfig | None = None,
                expert_parallel_ok: bool = True) -> nn.Module:
    """Apply activation checkpointing, compile, tensor or expert parallelism, FSDP2/DDP to ``model`` (a
    models.interface.CausalLM); materialise a meta model. Returns the module to call. ``expert_parallel_ok``:
    False shards an MoE model's experts with FSDP2 alone, whatever its moe_world_size (evaluation).

    With FSDP2 or TP the returned module *is* ``model`` (sharded in place); with DDP it wraps ``model``.
    """
    blocks = model.blocks()
    tp = tp if tp is not None and tp.tensor_parallel_degree > 1 else None
    tp_plan = layouts.check_tensor_parallel(model, tp, fsdp, world_size) if tp is not None else None
    ep_plan = layouts.expert_parallel_plan(model) if expert_parallel_ok else None
    if ep_plan is not None:
        layouts.check_expert_parallel(ep_plan.degree, fsdp, world_size, tp is not None)
    if fsdp is not None:
        fsdp1_notices(fsdp)
    if fsdp is not None and fsdp.cpu_offload and device.type != "cuda":
        raise ConfigError(f"fsdp_config.cpu_offload: offloads GPU memory to the CPU; this run is on {device.type} "
                          "(set it to false)")
    if precision == "amp_fp8":  # before checkpointing and compile wrap the Linears' forwards, before FSDP2 shards
        float8.convert(model, blocks, fsdp_all_gather=fsdp is not None and world_size > 1, tp=tp is not None)
    if fsdp is not None and fsdp.activation_checkpointing:
        if not blocks:
            raise ConfigError("fsdp_config.activation_checkpointing: the model's blocks() is empty, there is "
                              "nothing to checkpoint (set it to false)")
        checkpoint_modules(checkpoint_targets(model, blocks), fsdp.activation_checkpointing_mode,
                           fsdp.activation_checkpointing_reentrant)
    if compile_cfg is not None:
        for module in blocks if blocks and compile_cfg.scope == "block" else [model]:
            apply_compile(module, compile_cfg)

    meta = is_meta(model)
    # TP and EP split each block as it is materialised (apply_fsdp's prepare_block), then FSDP2 shards it: a rank
    # holds its shards plus one whole block, never the whole model (which a meta model is there to avoid)
    if tp_plan is not None:  # TP first (on a whole block), then FSDP2 over the data-parallel dimension
        mesh = layouts.tp_mesh(device.type, tp, world_size)
        tp_plan.prepare_model(model, tp.tensor_parallel_degree, tp.strategy)
        prepare = functools.partial(tp_plan.parallelize_block, mesh=mesh["tp"], strategy=tp.strategy)
        if fsdp is not None:
            apply_fsdp(model, fsdp, precision, device, world_size, seed, mesh=mesh["dp"], prepare_block=prepare)
        else:  # one TP group, no data parallelism: the same walk without FSDP2
            files = each_block(model, blocks, device, seed, lambda i, block: prepare(block))
            if files is not None:
                allocate_meta(model, device)
                files.fill(model)
        wrapped = model
        meta = is_meta(model)
    elif ep_plan is not None:  # experts split over ep ranks (on a whole block), then FSDP2: experts over edp, the
        mesh = layouts.ep_mesh(device.type, ep_plan.degree, world_size)  # rest over all ranks
        prepare = functools.partial(ep_plan.parallelize_block, mesh=mesh["ep"])
        apply_fsdp(model, fsdp, precision, device, world_size, seed, experts_mesh=mesh,
                   expert_modules=ep_plan.expert_modules, prepare_block=prepare)
        wrapped = model
        meta = is_meta(model)
    elif fsdp is not None and world_size > 1:
        if fsdp.sync_module_states and not meta:
            broadcast_from_rank0(model)
        apply_fsdp(model, fsdp, precision, device, world_size, seed)
        wrapped = model
        meta = is_meta(model)
    elif world_size > 1:
        if meta:
            materialize(model, device, seed)
            meta = False
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids)
    else:
        wrapped = model
    if meta:
        materialize(model, "cpu" if fsdp is not None and fsdp.cpu_offload else device, seed)
    return wrapped


def materialize(model: nn.Module, device: torch.device | str, seed: int) -> None:
    """Allocate a meta-device model's (possibly sharded) parameters and initialise them with the model's init;
    a model built from pretrained files then reads them (only tensors the files lack are initialised, when the
    model has a per-module initialiser)."""
    hooks = hooks_of(model)
    files, init_module = hooks.pretrained_weights, hooks.init_module
    if files is not None and init_module is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _materialize_modules(model.modules(), device, init_module, files.provided(model))
        allocate_meta(model, device)
        files.fill(model)
        return
    init = hooks.init_parameters
    if init is None:
        raise ConfigError("model.init_device: 'meta' needs a model whose model_hooks() give init_parameters "
                          "(models/interface.ModelHooks; or use init_device: cpu)")
    allocate_meta(model, device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        init()
    if files is not None:
        files.fill(model)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool):
    """Skip what gradient reduction can wait for the last microbatch: DDP's all-reduce (``no_sync``) and HSDP's
    all-reduce across replicas. FSDP's reduce-scatter runs after every microbatch, as under llm-foundry's FSDP, so a
    rank only ever accumulates its own shard: skipping it too (``set_requires_gradient_sync(False)``) would hold the
    whole model's gradients unsharded on every rank until the last microbatch (about 120 GiB per GPU for a 70B
    model), and recipes that fit under llm-foundry would run out of memory here."""
    if enabled:
        yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_all_reduce(False)
        try:
            yield
        finally:
            model.set_requires_all_reduce(True)
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


def activation_offload(fsdp: FSDPConfig | None, device: torch.device):
    """The context forward/backward run in: saved activations go to CPU with activation_cpu_offload."""
    if fsdp is None or not fsdp.activation_cpu_offload:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
