"""Feed-forward networks: MPT's MLP (up, activation, down) and the gated GLU variant (down(act(gate) * up)).

Both default to exact GELU, as in llm-foundry; set ``ffn_act_fn: {name: silu}`` for Llama's SwiGLU."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmfoundry.models.layers.act_fn import DEFAULT_ACT_FN, resolve_act_fn


class Activation(nn.Module):
    """``torch.nn.functional.<name>(x, **kwargs)``, as llm-foundry builds ffn_act_fn."""

    def __init__(self, name: str, **kwargs: Any):
        super().__init__()
        self.name, self.kwargs = name, kwargs
        self.fn = getattr(F, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, **self.kwargs)

    def extra_repr(self) -> str:
        return ", ".join([self.name] + [f"{k}={v!r}" for k, v in self.kwargs.items()])


def build_activation(spec: dict | None, ffn_type: str) -> Activation:
    """The activation named in ffn_config.ffn_act_fn; exact GELU by default (mptmlp and mptglu alike)."""
    name, kwargs = resolve_act_fn(spec or DEFAULT_ACT_FN)
    return Activation(name, **kwargs)


class MPTMLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, act: nn.Module, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.act = act
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)
        self.down_proj._is_residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class MPTGLU(MPTMLP):
    """down(act(gate(x)) * up(x)); with SiLU this is Llama's SwiGLU, weight for weight. The hidden width is
    expansion_ratio * d_model (or ffn_hidden_size) with no 2/3 scaling, and gate_proj is created after up/down,
    as in llm-foundry (so that a seed initialises the same layers in the same order)."""

    def __init__(self, d_model: int, hidden: int, act: nn.Module, bias: bool):
        super().__init__(d_model, hidden, act, bias)
        self.gate_proj = nn.Linear(d_model, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def build_ffn(arch) -> nn.Module:
    f = arch.ffn_config
    act = build_activation(f.ffn_act_fn, f.ffn_type)
    cls = MPTMLP if f.ffn_type == "mptmlp" else MPTGLU
    return cls(arch.d_model, arch.ffn_hidden, act, bias=not arch.no_bias)
