"""Normalisation layers: LayerNorm and RMSNorm, each in a full-precision and a low-precision flavour.

The low-precision flavours run the norm in the autocast dtype (bf16/fp16) instead of fp32, which saves memory
traffic on GPUs; outside autocast they are identical to the plain ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return None


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, low_precision: bool = False, device=None):
        super().__init__()
        self.eps, self.low_precision = eps, low_precision
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.bias = nn.Parameter(torch.zeros(dim, device=device)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(x) if self.low_precision else None
        if dtype is None:
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        # Run in the autocast dtype: cast explicitly and switch autocast off so it does not upcast to fp32.
        with torch.autocast(x.device.type, enabled=False):
            bias = self.bias.to(dtype) if self.bias is not None else None
            return F.layer_norm(x.to(dtype), x.shape[-1:], self.weight.to(dtype), bias, self.eps)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, as llm-foundry computes it: in fp32 (weight included) and cast back to x's dtype;
    low_precision computes in the autocast dtype instead and also returns x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False, low_precision: bool = False, device=None):
        super().__init__()
        self.eps, self.low_precision = eps, low_precision
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        # RMSNorm has no bias in llm-foundry or Llama; `bias` is accepted so that all norms share a signature.
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(x) if self.low_precision else None
        if dtype is not None:
            with torch.autocast(x.device.type, enabled=False):
                return F.rms_norm(x.to(dtype), x.shape[-1:], self.weight.to(dtype), self.eps).to(x.dtype)
        return F.rms_norm(x.float(), x.shape[-1:], self.weight.float(), self.eps).to(x.dtype)


def build_norm(norm_type: str, dim: int, eps: float, bias: bool, device=None) -> nn.Module:
    low_precision = norm_type.startswith("low_precision_")
    if norm_type.endswith("layernorm"):
        return LayerNorm(dim, eps, bias=bias, low_precision=low_precision, device=device)
    if norm_type.endswith("rmsnorm"):
        return RMSNorm(dim, eps, low_precision=low_precision, device=device)
    raise ValueError(f"unknown norm_type {norm_type!r}")
