"""Tiny model configs shared by the model tests."""

from __future__ import annotations

import copy

import torch

from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

TINY = dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=512, no_bias=True)


def tiny_config(**overrides) -> MPTConfig:
    values = copy.deepcopy(TINY)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key].update(value)
        else:
            values[key] = value
    return MPTConfig(**values)


def tiny_model(seed: int = 0, **overrides) -> MPTForCausalLM:
    torch.manual_seed(seed)
    model = MPTForCausalLM(tiny_config(**overrides)).eval()
    return model


def randomize_norms(model: torch.nn.Module, seed: int = 1) -> None:
    """Norm weights start at 1 / 0; perturb them so that parity tests would notice a swapped or missing norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "_ln" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
