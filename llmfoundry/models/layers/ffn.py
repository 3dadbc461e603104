"""Feed-forward networks: MPT's MLP (up, activation, down) and the gated GLU variant (SwiGLU by default)."""

from __future__ import annotations

import torch
from torch import nn


def build_activation(spec: dict | None, ffn_type: str):
    """The activation named in ffn_config.ffn_act_fn; exact GELU for mptmlp and SiLU for mptglu by default."""
    spec = dict(spec or {"name": "gelu" if ffn_type == "mptmlp" else "silu"})
    name = spec.pop("name")
    if name == "gelu":
        return nn.GELU(approximate=spec.get("approximate", "none"))
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "silu":
        return nn.SiLU()
    if name == "relu":
        return nn.ReLU()
    raise ValueError(f"unknown activation {name!r}")


class MPTMLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, act: nn.Module, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.act = act
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)
        self.down_proj._is_residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class MPTGLU(nn.Module):
    """down(act(gate(x)) * up(x)); with SiLU this is Llama's SwiGLU, weight for weight."""

    def __init__(self, d_model: int, hidden: int, act: nn.Module, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.act = act
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)
        self.down_proj._is_residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def build_ffn(arch) -> nn.Module:
    f = arch.ffn_config
    act = build_activation(f.ffn_act_fn, f.ffn_type)
    cls = MPTMLP if f.ffn_type == "mptmlp" else MPTGLU
    return cls(arch.d_model, arch.ffn_hidden, act, bias=not arch.no_bias)
