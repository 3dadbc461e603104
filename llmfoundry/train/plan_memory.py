"""Memory of one GPU while a recipe trains, measured on fake tensors (nothing real is allocated).

Parameters, gradients and optimizer state come from the recipe's model built on the meta device by the real
builder (``train/builders.build_model``), counted per rank by FSDP2's sharding rules. Activations are measured:
the model is rebuilt with 1 and with 2 blocks, materialised under ``FakeTensorMode`` on the CPU (with FSDP2's
parameter dtype when the recipe's mixed precision casts them), and one microbatch of the recipe's shape runs
forward (under the recipe's autocast), the trainer's loss, backward and an optimizer step, then the same again
tracked by torch's MemTracker (torch.distributed._tools.mem_tracker; ``ActivationPeak`` keeps the moment its
activations + temporaries peak, and the gradients made by then). Activations of L blocks are then ``m1 + (L - 1) (m2 -
m1)``: the embedding, the logits and the loss (often the largest single activation) are in ``m1``, one block's
saved tensors in the difference. Where the peak falls can move with the blocks (a large vocabulary's embedding or
loss backward outweighs 1 or 2 blocks' activations, not 24), so the saved activations' own peak (the start of the
backward, every block's) is extrapolated the same way and the larger of the two taken. With activation checkpointing the same runs measure the block inputs kept and
one block recomputed. The modes that are uniform per block (``full``, ``selective_op``: the per-op policy of
train/activation_ckpt.py, run as the trainer runs it) are measured so; ``selective_layer_N`` mixes full and
uncheckpointed blocks, and train/plan.py composes it from those two measurements. The optimizer step's temporaries
(foreach kernels) are measured the same way, and the FLOPs of the step (torch's FlopCounterMode: a checkpointing
mode's recompute is what it adds to the uncheckpointed run's).

With tensor parallelism (``tp_config``) the fake run applies the model's own plan (models/mpt/tensor_parallel.py,
as train/parallel.py does) on a fake process group of ``tensor_parallel_degree`` ranks (torch's ``fake`` backend:
collectives return at once, nothing leaves the process), as its rank 0: the parameters, activations and
temporaries measured are one TP rank's, and the collectives the plan's DTensors run are counted
(``CollectiveBytes``: the bytes each rank moves through a ring, recompute included).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.device_mesh import init_device_mesh
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore  # also registers torch's "fake" backend
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from llmfoundry.core import precision as prec
from llmfoundry.core.dist import local_tensor
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.models.interface import label_offset
from llmfoundry.models.loss import TokenLoss
from llmfoundry.train import layouts, parallel
from llmfoundry.train.activation_ckpt import checkpoint_modules
from llmfoundry.train.builders import build_model, build_optimizer
from llmfoundry.train.recipe import Component

# Optimizer state kept per parameter element, in units of the parameter's own size (train/optim.py, torch's AdamW)
STATE_PER_PARAM = {"decoupled_adamw": 2, "adamw": 2, "decoupled_lionw": 1, "clip_lion": 1, "adalr_lion": 1,
                   "no_op": 0}


@dataclass
class Measured:
    """One fake microbatch of a model with ``layers`` blocks (bytes)."""

    layers: int
    activations: int  # the peak of activations + temporaries in forward + backward (MemTracker's categories)
    grads_at_peak: int  # gradients already made at that moment (the head's, mostly)
    optimizer_temp: int  # an optimizer step's own temporaries, above parameters, gradients and state
    saved: int  # the peak of the saved activations alone (MemTracker's Activation: at the start of the backward)
    params: int  # elements on this rank (a TP rank's shards of the split ones)
    flops: int  # of the forward and backward (with its recompute), FlopCounterMode's count
    comm: int = 0  # bytes one rank moves in the forward and backward's collectives (CollectiveBytes)


def shrunk(model: Component, layers: int) -> Component:
    """``model`` with ``layers`` blocks, built on the meta device."""
    settings = model.settings
    changes = {"n_layers": layers} if hasattr(settings, "n_layers") else {}
    if hasattr(settings, "init_device"):
        changes["init_device"] = "meta"
    if getattr(settings, "activation_checkpointing_target", None) is not None:
        changes["activation_checkpointing_target"] = None  # every block: the measured layer is checkpointed
    return dataclasses.replace(model, settings=dataclasses.replace(settings, **changes))


def meta_model(model: Component):
    """The recipe's model on the meta device, built by the trainer's builder (no tokenizer: sizes only)."""
    if model.name != "mpt_causal_lm":
        # a Hugging Face model would be built from its downloaded weights, and its blocks are not counted here
        raise ConfigError(f"model.name: {model.name}: plan measures mpt_causal_lm models only so far")
    settings = model.settings
    if hasattr(settings, "init_device"):
        model = dataclasses.replace(model, settings=dataclasses.replace(settings, init_device="meta"))
    with torch.device("meta"):
        return build_model(model, None)


def _by_name(device_snapshot: dict) -> dict[str, int]:
    """One device's snapshot keyed by category name ("Activation", "Temp", "Gradient", ..., "Total")."""
    return {str(getattr(k, "value", k)): v for k, v in device_snapshot.items()}


class ActivationPeak(MemTracker):
    """torch's MemTracker that also keeps the moment its activations + temporaries peak, with the gradients made by
    then (``activation_peak``: bytes, gradient bytes). The total's peak alone is no base for extrapolating: where
    it falls moves with the number of blocks (at the end of the backward when the gradients outweigh what a block
    keeps), and the activations at it with it."""

    def __init__(self) -> None:
        super().__init__()
        self.activation_peak = (0, 0)
        self.saved_peak = 0

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        for snap in self._curr_mem_snap.values():
            level = snap[_MemRefType.ACT] + snap[_MemRefType.TEMP] + snap[_MemRefType.OTH]
            if level > self.activation_peak[0]:
                self.activation_peak = (level, snap[_MemRefType.GRAD])
            self.saved_peak = max(self.saved_peak, snap[_MemRefType.ACT])


def _snapshot(tracker: MemTracker, kind: str) -> dict[str, int]:
    snapshots = tracker.get_tracker_snapshot(kind)
    return _by_name(next(iter(snapshots.values()))) if snapshots else {}


class CollectiveBytes(TorchDispatchMode):
    """The bytes one rank sends through a ring in the functional collectives run under it (DTensor's
    redistributions), each at its group's size n: all-gather (n - 1) x its input, reduce-scatter (n - 1) / n of its
    input, all-reduce twice that, all-to-all (n - 1) / n of its input (the rows for other ranks, evenly split)."""

    SHARE = {"all_gather_into_tensor": lambda n: n - 1, "reduce_scatter_tensor": lambda n: (n - 1) / n,
             "all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all_single": lambda n: (n - 1) / n}

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func._schema.name.partition("::")
        if namespace == "_c10d_functional" and name in self.SHARE:
            group = torch_dist.distributed_c10d._resolve_process_group(args[-1])
            tensor = args[0]
            self.bytes += tensor.numel() * tensor.element_size() * self.SHARE[name](group.size())
        return func(*args, **(kwargs or {}))


class GroupedMatmulAnyDtype(TorchDispatchMode):
    """torch's fake (meta) ``_grouped_mm`` takes bf16 only (CUDA's rule), while the CPU kernel that MoE experts run
    (models/layers/moe.py) also takes fp32 and fp16: such a call's output, allocated as the kernel allocates it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.ops.aten._grouped_mm.default or args[0].dtype == torch.bfloat16:
            return func(*args, **kwargs)
        a, b = args[0], args[1]
        offsets = args[2] if len(args) > 2 else kwargs.get("offs")
        if a.dim() == 2 and b.dim() == 2:  # (M, a) x (a... grouped by offsets) -> one matrix per group
            shape = (offsets.shape[0], a.shape[0], b.shape[1])
        elif a.dim() == 2:  # rows grouped by expert x (E, a, b)
            shape = (a.shape[0], b.shape[-1])
        elif b.dim() == 2:
            shape = (a.shape[1], b.shape[1])
        else:  # batched
            shape = (a.shape[0], a.shape[1], b.shape[-1])
        return torch.empty(shape, dtype=kwargs.get("out_dtype") or a.dtype, device=a.device)


@contextlib.contextmanager
def tensor_parallel_ranks(degree: int):
    """A fake process group of ``degree`` ranks (this process is rank 0) and its 1-D mesh, for the fake run's
    tensor-parallel plan; torch's ``fake`` backend runs no communication."""
    if torch_dist.is_initialized():
        raise ConfigError("tp_config: plan measures tensor parallelism on a fake process group of its own; run it "
                          "outside a distributed job")
    torch_dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=degree)
    try:
        yield init_device_mesh("cpu", (degree,), mesh_dim_names=("tp",))
    finally:
        torch_dist.destroy_process_group()


def measure(cfg, micro: int, layers: int, mode: str | None, param_dtype: torch.dtype, fake: bool = True) -> Measured:
    """One training step of one fake microbatch (``micro`` x max_seq_len) for the recipe's model with ``layers``
    blocks, the second one (the optimizer state exists), tracked by torch's MemTracker
    (torch.distributed._tools.mem_tracker: the categories of the peak); ``mode``: the
    activation_checkpointing_mode applied to every block (None: no checkpointing); ``param_dtype``: the dtype
    FSDP2 computes in (the sharded weights' own dtype without FSDP2's mixed precision). With ``cfg.tp_config``
    (degree > 1) the blocks are split by the model's tensor-parallel plan, on a fake process group."""
    tp = cfg.tp_config if cfg.tp_config is not None and cfg.tp_config.tensor_parallel_degree > 1 else None
    if tp is None:
        return _measure(cfg, micro, layers, mode, param_dtype, fake, None)
    with tensor_parallel_ranks(tp.tensor_parallel_degree) as mesh:
        return _measure(cfg, micro, layers, mode, param_dtype, fake, (tp, mesh))


def _measure(cfg, micro: int, layers: int, mode: str | None, param_dtype: torch.dtype, fake: bool,
             tensor_parallel) -> Measured:
    device = torch.device("cpu")
    with torch.device("meta"):
        model = build_model(shrunk(cfg.model, layers), None).to(param_dtype)
    if mode is not None:  # the trainer's own code (parallel.py); non-reentrant, which every mode can use
        checkpoint_modules(parallel.checkpoint_targets(model, model.blocks()), mode, reentrant=False)
    if tensor_parallel is not None:  # after checkpointing, as parallel.py applies them
        tp, mesh = tensor_parallel
        plan = layouts.check_tensor_parallel(model, tp, None, tp.tensor_parallel_degree)  # the trainer's checks
        plan.prepare_model(model, tp.tensor_parallel_degree, tp.strategy)
        for block in model.blocks():
            plan.parallelize_block(block, mesh, tp.strategy)
    loss_fn = TokenLoss(label_offset(model))

    def forward_backward() -> None:
        with prec.autocast(cfg.precision, device):
            output = model(input_ids=ids)
        loss_fn(output.logits, ids, reduction="sum").backward()

    try:
        with (FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(),
              GroupedMatmulAnyDtype() if fake else contextlib.nullcontext()):  # below the trackers entered next
            parallel.materialize(model, device, 0)
            optimizer = build_optimizer(cfg.optimizer, model)
            ids = torch.zeros((micro, cfg.max_seq_len), dtype=torch.long)
            with FlopCounterMode(display=False) as counter:
                forward_backward()  # the first step makes the optimizer state
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker, collectives = ActivationPeak(), CollectiveBytes()
            tracker.track_external(model, optimizer)
            with tracker, collectives:
                forward_backward()
            stepper = MemTracker()
            stepper.track_external(model, optimizer)
            held = _snapshot(stepper, "current").get("Total", 0)
            with stepper:
                optimizer.step()  # the steady step: its temporaries alone
            optimizer_temp = _snapshot(stepper, "peak").get("Total", 0) - held
    except ConfigError:
        raise
    except Exception as error:  # a model the fake run cannot follow (data-dependent control flow, ...)
        raise ConfigError(f"model: its memory could not be measured on fake tensors ({first_line(error)})") from None
    activations, grads_at_peak = tracker.activation_peak
    return Measured(layers=layers, activations=activations, grads_at_peak=grads_at_peak,
                    optimizer_temp=max(0, optimizer_temp), saved=tracker.saved_peak,
                    params=sum(local_tensor(p).numel() for p in model.parameters()), flops=counter.get_total_flops(),
                    comm=round(collectives.bytes))
