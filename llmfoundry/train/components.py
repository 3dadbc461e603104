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
import weakref
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

try:  # the one torch function that names a state key (the names get_model_state_dict gives); see StateNames
    from torch.distributed.checkpoint.state_dict import _get_fqns
except ImportError:  # a torch that moved it: every save asks torch's get_*_state_dict, which is slower, not wrong
    _get_fqns = None

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
        state = names_of(self.model).model_state()
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
        return names_of(self.model).optimizer_state(self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        strict = self.strict and not hooks_of(self.model).saves_adapters_only
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(strict=strict))


class StateNames:
    """The names torch.distributed.checkpoint gives a model's state and its optimizer's (wrappers such as
    torch.compile's ``_orig_mod.`` and activation checkpointing's taken out), worked out once per model.

    torch's ``get_model_state_dict`` / ``get_optimizer_state_dict`` work every name out again at every call: about
    25 ms each for a 24-block MPT's 300 tensors, most of the time a save_async holds the training loop (issue #30).
    The dicts given here are torch's, key for key and in the same order (tests/train/test_checkpoint_components.py
    compares them); a name is worked out again when the model's state keys or the optimizer's parameters change,
    and torch's functions answer wherever they would do more than name (an optimizer with no state yet, which
    torch first fills with a step of zero gradients; state torch names more than one way)."""

    def __init__(self, model: torch.nn.Module):
        self._model = weakref.ref(model)
        self._keys: dict[str, str] | None = None  # model.state_dict()'s key -> its name
        self._params: list[torch.Tensor] = []  # the optimizer's parameters, in its order, when named
        self._param_names: list[str] | None = None

    def _name(self, key: str) -> str | None:
        names = _get_fqns(self._model(), key) if _get_fqns is not None else ()
        return next(iter(names)) if len(names) == 1 else None

    def model_state(self) -> dict[str, Any]:
        model = self._model()
        raw = model.state_dict()
        if self._keys is None or raw.keys() != self._keys.keys():
            self._keys = {key: self._name(key) for key in raw}
        if not raw or None in self._keys.values():
            return get_model_state_dict(model)
        state, moved = {}, {}
        for key, value in raw.items():  # torch moves a renamed key to the end
            name = self._keys[key]
            (state if name == key else moved)[name] = value
        state.update(moved)
        return state

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        model = self._model()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if len(params) != len(self._params) or any(a is not b for a, b in zip(params, self._params)):
            named = {}
            for key, param in model.named_parameters():
                named.setdefault(param, key)
            self._params = params
            self._param_names = [self._name(named[p]) if p in named else None for p in params]
        if not optimizer.state or None in self._param_names:
            return get_optimizer_state_dict(model, optimizer)
        raw = optimizer.state_dict()  # its parameters are numbered in the order of param_groups
        names = self._param_names
        groups = [{**group, "params": [names[i] for i in group["params"]]} for group in raw["param_groups"]]
        return {"state": {names[i]: value for i, value in raw["state"].items()}, "param_groups": groups}


_NAMES: "weakref.WeakKeyDictionary[torch.nn.Module, StateNames]" = weakref.WeakKeyDictionary()


def names_of(model: torch.nn.Module) -> StateNames:
    """The model's :class:`StateNames`, kept for as long as the model lives (one per model, across saves)."""
    if model not in _NAMES:
        _NAMES[model] = StateNames(model)
    return _NAMES[model]


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
