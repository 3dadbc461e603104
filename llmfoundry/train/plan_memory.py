"""Memory of one GPU while a recipe trains, measured on fake tensors (nothing real is allocated).

Parameters, gradients and optimizer state come from the recipe's model built on the meta device by the real
builder (``train/builders.build_model``), counted per rank by FSDP2's sharding rules. Activations are measured:
the model is rebuilt with 1 and with 2 blocks, materialised under ``FakeTensorMode`` on the CPU (with FSDP2's
parameter dtype when the recipe's mixed precision casts them), and one microbatch of the recipe's shape runs
forward (under the recipe's autocast), the trainer's loss, backward and two optimizer steps, while a dispatch
mode records every storage that is allocated and freed. Activations of L blocks are then ``m1 + (L - 1) (m2 -
m1)``: the embedding, the logits and the loss (often the largest single activation) are in ``m1``, one block's
saved tensors in the difference; with activation checkpointing the same runs measure the block inputs kept and
one block recomputed. The optimizer step's temporaries (foreach kernels) are measured the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch._subclasses.fake_tensor import FakeTensorMode

from llmfoundry.core import precision as prec
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.models.interface import label_offset
from llmfoundry.models.loss import TokenLoss
from llmfoundry.train import parallel
from llmfoundry.train.builders import build_model, build_optimizer
from llmfoundry.train.recipe import Component

# Optimizer state kept per parameter element, in units of the parameter's own size (train/optim.py, torch's AdamW)
STATE_PER_PARAM = {"decoupled_adamw": 2, "adamw": 2, "decoupled_lionw": 1, "clip_lion": 1, "adalr_lion": 1,
                   "no_op": 0}


class LiveBytes(TorchDispatchMode):
    """Every storage an op creates, with the moment it is freed: a timeline of (id, +bytes / -bytes). Storage
    addresses are reused once freed, so each allocation gets its own id."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, int]] = []
        self._live: dict[int, tuple[int, weakref.ref]] = {}  # storage address -> (id, weak reference)

    def _free(self, address: int, uid: int, size: int) -> None:
        if self._live.get(address, (None,))[0] == uid:
            del self._live[address]
        self.events.append((uid, -size))

    def _see(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        address = storage._cdata
        if address in self._live:
            return
        uid, size = len(self.events), storage.nbytes()
        ref = weakref.ref(storage, lambda _, a=address, u=uid, n=size: self._free(a, u, n))
        self._live[address] = (uid, ref)
        self.events.append((uid, size))

    def ids(self, tensors) -> frozenset:
        """The ids of the live storages of ``tensors`` (those made while tracking)."""
        found = (self._live.get(t.untyped_storage()._cdata) for t in tensors if t is not None)
        return frozenset(entry[0] for entry in found if entry is not None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t)
        return out

    def mark(self) -> int:
        return len(self.events)

    def peak(self, start: int = 0, end: int | None = None, exclude: frozenset = frozenset()) -> tuple[int, int]:
        """(peak bytes above what was live at ``start``, the event index of that peak) in events[start:end],
        storages in ``exclude`` left out."""
        level = best = 0
        at = start
        for i, (key, delta) in enumerate(self.events[start:end], start):
            if key in exclude:
                continue
            level += delta
            if level > best:
                best, at = level, i
        return best, at

    def live_at(self, index: int, keys: frozenset) -> int:
        """Bytes of the storages in ``keys`` alive just after event ``index``."""
        level = 0
        for key, delta in self.events[: index + 1]:
            if key in keys:
                level += delta
        return level


@dataclass
class Measured:
    """One fake microbatch of a model with ``layers`` blocks (bytes)."""

    layers: int
    activations: int  # peak of forward + backward above the parameters, gradients left out
    grads_at_peak: int  # gradients already made at that moment (the head's, mostly)
    optimizer_temp: int  # an optimizer step's own temporaries, above parameters, gradients and state
    params: int  # elements


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
    settings = model.settings
    if hasattr(settings, "init_device"):
        model = dataclasses.replace(model, settings=dataclasses.replace(settings, init_device="meta"))
    with torch.device("meta"):
        return build_model(model, None)


def measure(cfg, micro: int, layers: int, checkpointing: bool, param_dtype: torch.dtype, fake: bool = True) -> Measured:
    """Forward, loss, backward and two optimizer steps of one fake microbatch (``micro`` x max_seq_len) for the
    recipe's model with ``layers`` blocks; ``param_dtype``: the dtype FSDP2 computes in (the sharded weights' own
    dtype without FSDP2's mixed precision)."""
    device = torch.device("cpu")
    with torch.device("meta"):
        model = build_model(shrunk(cfg.model, layers), None).to(param_dtype)
    if checkpointing:
        for module in parallel.checkpoint_targets(model, model.blocks()):
            parallel.apply_activation_checkpointing(module, reentrant=False)
    loss_fn = TokenLoss(label_offset(model))
    tracker = LiveBytes()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
            parallel.materialize(model, device, 0)
            optimizer = build_optimizer(cfg.optimizer, model)
            ids = torch.zeros((micro, cfg.max_seq_len), dtype=torch.long)
            params = list(model.parameters())
            with tracker:
                start = tracker.mark()
                with prec.autocast(cfg.precision, device):
                    output = model(input_ids=ids)
                logits = output.logits
                loss_fn(logits, ids, reduction="sum").backward()
                del output, logits
                end = tracker.mark()
                optimizer.step()  # makes the state
                optimizer.step()  # the steady step: its temporaries alone
                step_end = tracker.mark()
            grads = tracker.ids(p.grad for p in params)
            state = tracker.ids(t for s in optimizer.state.values() for t in s.values()
                                  if isinstance(t, torch.Tensor))
    except ConfigError:
        raise
    except Exception as error:  # a model the fake run cannot follow (data-dependent control flow, ...)
        raise ConfigError(f"model: its memory could not be measured on fake tensors ({first_line(error)})") from None
    activations, at = tracker.peak(start, end, exclude=grads)
    optimizer_temp, _ = tracker.peak(end, step_end, exclude=grads | state)
    return Measured(layers=layers, activations=activations, grads_at_peak=tracker.live_at(at, grads),
                    optimizer_temp=optimizer_temp, params=sum(p.numel() for p in params))
