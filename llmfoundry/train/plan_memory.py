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
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from llmfoundry.core import precision as prec
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.models.interface import label_offset
from llmfoundry.models.loss import TokenLoss
from llmfoundry.train import parallel
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
    params: int  # elements
    flops: int  # of the forward and backward (with its recompute), FlopCounterMode's count


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


def measure(cfg, micro: int, layers: int, mode: str | None, param_dtype: torch.dtype, fake: bool = True) -> Measured:
    """One training step of one fake microbatch (``micro`` x max_seq_len) for the recipe's model with ``layers``
    blocks, the second one (the optimizer state exists), tracked by torch's MemTracker
    (torch.distributed._tools.mem_tracker: the categories of the peak); ``mode``: the
    activation_checkpointing_mode applied to every block (None: no checkpointing); ``param_dtype``: the dtype
    FSDP2 computes in (the sharded weights' own dtype without FSDP2's mixed precision)."""
    device = torch.device("cpu")
    with torch.device("meta"):
        model = build_model(shrunk(cfg.model, layers), None).to(param_dtype)
    if mode is not None:  # the trainer's own code (parallel.py); non-reentrant, which every mode can use
        checkpoint_modules(parallel.checkpoint_targets(model, model.blocks()), mode, reentrant=False)
    loss_fn = TokenLoss(label_offset(model))

    def forward_backward() -> None:
        with prec.autocast(cfg.precision, device):
            output = model(input_ids=ids)
        loss_fn(output.logits, ids, reduction="sum").backward()

    try:
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
            parallel.materialize(model, device, 0)
            optimizer = build_optimizer(cfg.optimizer, model)
            ids = torch.zeros((micro, cfg.max_seq_len), dtype=torch.long)
            with FlopCounterMode(display=False) as counter:
                forward_backward()  # the first step makes the optimizer state
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker = ActivationPeak()
            tracker.track_external(model, optimizer)
            with tracker:
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
                    params=sum(p.numel() for p in model.parameters()), flops=counter.get_total_flops())
