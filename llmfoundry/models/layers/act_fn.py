"""``model.ffn_config.ffn_act_fn``: llm-foundry's activation spec, ``{name: <torch.nn.functional function>, <its
keyword arguments>}``, resolved and checked here; layers/ffn.py builds it.

Any function of torch.nn.functional that maps a tensor to one of the same shape is accepted, so the check tries
the spec on a small tensor. The usual activations (``KNOWN_ACTIVATIONS``) pass that trial and are accepted without
it, so that checking a recipe that uses one of them does not import torch; any other spec imports torch (by name,
as the registry imports a builder) to be tried.
"""

from __future__ import annotations

import importlib
from typing import Any

from llmfoundry.core.errors import first_line

DEFAULT_ACT_FN = {"name": "gelu", "approximate": "none"}  # llm-foundry's default for every ffn_type

# function of torch.nn.functional -> keyword arguments with which it maps any tensor to one of the same shape
# (tests/models/test_catalog.py tries every one on torch)
KNOWN_ACTIVATIONS: dict[str, list[dict[str, Any]]] = {
    "gelu": [{}, {"approximate": "none"}, {"approximate": "tanh"}],
    **{name: [{}] for name in ("silu", "relu", "leaky_relu", "sigmoid", "tanh", "mish", "elu", "selu", "celu",
                                "softplus", "relu6", "hardswish", "hardsigmoid")},
}


def resolve_act_fn(spec: dict) -> tuple[str, dict]:
    """(function name in torch.nn.functional, keyword arguments); gelu_tanh is kept as GELU's tanh form."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name == "gelu_tanh":
        return "gelu", {"approximate": "tanh", **spec}
    return name, spec


def activation_problem(spec: Any) -> str | None:
    """Why an ffn_act_fn mapping is not a usable torch.nn.functional activation (a key suffix + message), or None."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return f": a mapping {{name: <torch.nn.functional activation>, ...}}, got {spec!r}"
    name, kwargs = resolve_act_fn(spec)
    if kwargs in KNOWN_ACTIVATIONS.get(name, []):
        return None
    return trial_problem(name, kwargs)


def trial_problem(name: str, kwargs: dict[str, Any]) -> str | None:
    """``activation_problem`` of a resolved spec, found by applying it to a small tensor."""
    torch = importlib.import_module("torch")
    functional = importlib.import_module("torch.nn.functional")
    fn = getattr(functional, name, None)
    if name.startswith("_") or not callable(fn):
        return f".name: '{name}' is not a function of torch.nn.functional (e.g. gelu, silu, relu, leaky_relu)"
    try:
        out = fn(torch.linspace(-2, 2, 8).view(2, 4), **kwargs)
    except (TypeError, ValueError, RuntimeError) as error:
        return f": torch.nn.functional.{name}({', '.join(sorted(kwargs))}) is not an activation ({first_line(error)})"
    if not isinstance(out, torch.Tensor) or out.shape != (2, 4):
        return f".name: torch.nn.functional.{name} does not map a tensor to one of the same shape"
    return None
