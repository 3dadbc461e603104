"""Checkpointed state as components: each piece of a run's state saves and restores itself.

A checkpoint is the dict ``{name: Component}`` the trainer hands over (``Trainer.checkpoint_components``): model,
optimizer, scheduler, time, dataloader, rng and every callback that declares a ``state_name``. Each component's
object has ``state_dict()`` / ``load_state_dict(state)``; its ``kind`` says how it is stored:

=========  ========================================================================================================
sharded    in the DCP shards, resharded on load (model, optimizer)
shared     the same on every rank: written in every ``rank{r}.pt``, read from rank 0's (time, scheduler, loader)
per_rank   each rank's own: read from this rank's file, and only on the world size that wrote it (rng)
=========  ========================================================================================================

:func:`select` is the one place where ``save_weights_only`` / ``load_weights_only`` and the section patterns of
``save_ignore_keys`` / ``load_ignore_keys`` decide which components a save writes and a load reads, and which of
the model's weights (:meth:`ModelState.leaving_out`). train.checkpoint lays the components out on disk and
train.composer_checkpoint maps llm-foundry's (Composer's) checkpoints onto the same components, so a new piece of
state is one new component, in the file that owns it.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from llmfoundry.models.interface import hooks_of

Kind = Literal["sharded", "shared", "per_rank"]


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Component:
    """One piece of checkpointed state. ``name``: its key in the checkpoint, and the section that
    ``save_ignore_keys`` / ``load_ignore_keys`` patterns name (train.compat.IgnoreKeys). ``weights``: the model
    weights, all that ``load_weights_only`` reads."""

    name: str
    state: Stateful
    kind: Kind = "shared"
    weights: bool = False


def select(components: dict[str, Component], *, weights_only: bool, ignore: Any, saving: bool) -> dict[str, Component]:
    """The components a save writes (``saving``) or a load reads. ``save_weights_only`` leaves the optimizer out
    (time, scheduler, loader and rng are small and let a run resume where it was); ``load_weights_only`` reads the
    weights alone. A section that an ignore pattern names is left out (on load: left as it is); the model's
    weights that key patterns name are left out of the model's state, which then loads without strictness, as
    does the optimizer's."""
    chosen = {}
    for name, component in components.items():
        if weights_only and not component.weights and (not saving or component.kind == "sharded"):
            continue
        if ignore and ignore.section(name):
            continue
        if ignore and isinstance(component.state, (ModelState, OptimizerState)):
            component = dataclasses.replace(component, state=component.state.leaving_out(ignore))
        chosen[name] = component
    return chosen


class ModelState:
    """The model's weights: all of them, or only the trained parameters of a LoRA model whose recipe says
    should_save_peft_only (the frozen base comes from its pretrained folder again on load, as in Composer).
    ``ignore``: the weights that key patterns leave out (neither saved nor loaded). ``strict``: a load must
    set every weight (load_strict_model_weights); it never is when some are left out."""

    def __init__(self, model: torch.nn.Module, *, strict: bool = True, ignore: Any = None):
        self.model, self.strict, self.ignore = model, strict, ignore

    def leaving_out(self, ignore: Any) -> "ModelState":
        return ModelState(self.model, strict=self.strict, ignore=ignore)

    def state_dict(self) -> dict[str, Any]:
        state = get_model_state_dict(self.model)
        if hooks_of(self.model).saves_adapters_only:
            trained = {name for name, param in self.model.named_parameters() if param.requires_grad}
            state = {name: value for name, value in state.items() if name in trained}
        if self.ignore:
            state = {name: value for name, value in state.items() if not self.ignore.model_key(name)}
        return state

    @property
    def partial(self) -> bool:
        """Whether this state leaves weights out (adapters only, ignored keys), so that loading it is not strict."""
        return bool(self.ignore) or hooks_of(self.model).saves_adapters_only

    def load_state_dict(self, state: dict[str, Any]) -> None:
        options = StateDictOptions(strict=self.strict and not self.partial)
        set_model_state_dict(self.model, state, options=options)


class OptimizerState:
    """The optimizer's state and parameter groups, by parameter name (any sharding)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, strict: bool = True):
        self.model, self.optimizer, self.strict = model, optimizer, strict

    def leaving_out(self, ignore: Any) -> "OptimizerState":
        return OptimizerState(self.model, self.optimizer, strict=False)  # as the model's, once patterns act

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        strict = self.strict and not hooks_of(self.model).saves_adapters_only
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(strict=strict))


class RNGState:
    """Python's, numpy's, torch's (and CUDA's) random generators, as tensors and plain types, so that
    ``torch.load(weights_only=True)`` reads them back."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
        state = {"python": random.getstate(), "torch": torch.get_rng_state(),
                 "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                           "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        numpy = state["numpy"]
        np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                             numpy["has_gauss"], numpy["cached_gaussian"]))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def weights_of(model: torch.nn.Module, *, strict: bool = True) -> dict[str, Component]:
    """The components of a model alone (to load a checkpoint's weights for evaluation, conversion, generation)."""
    return {"model": Component("model", ModelState(model, strict=strict), "sharded", weights=True)}


def training_components(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
                        strict: bool = True) -> dict[str, Component]:
    """Model, optimizer and rng: what every training run checkpoints besides its own time, schedule and data."""
    components = {"model": Component("model", ModelState(model, strict=strict), "sharded", weights=True)}
    if optimizer is not None:
        components["optimizer"] = Component("optimizer", OptimizerState(model, optimizer, strict=strict), "sharded")
    components["rng"] = Component("rng", RNGState(), "per_rank")
    return components


def restore(components: dict[str, Component], states: dict[str, Any]) -> list[str]:
    """Load each state into its component (a name without a state is left as it is); returns the names loaded."""
    loaded = []
    for name, component in components.items():
        if states.get(name) is not None:
            component.state.load_state_dict(states[name])
            loaded.append(name)
    return loaded
