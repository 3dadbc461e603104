"""Parameter initialisation schemes (llm-foundry's names), applied module by module.

Applied per module so that a model created on the meta device can be materialised and initialised shard by
shard (the trainer calls ``model.init_parameters()`` after ``to_empty``). Linear layers that write into the
residual stream carry ``_is_residual = True`` and are scaled down by ``init_div_is_residual``; a fused Wqkv
carries ``_fused_splits`` so that q, k and v are each initialised as if they were separate layers.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from llmfoundry.models.layers.norm import LayerNorm, RMSNorm


def _weight_init_fn(cfg, d_model: int, n_layers: int):
    """(fn(tensor), residual divisor) for the scheme named in init_config."""
    name = cfg.name
    small_std = math.sqrt(2 / (5 * d_model))
    if name == "baseline_":
        fn = partial(nn.init.normal_, mean=0.0, std=cfg.init_std)
    elif name == "small_init_":
        fn = partial(nn.init.normal_, mean=0.0, std=small_std)
    elif name == "neox_init_":
        # GPT-NeoX: small init everywhere, residual outputs at 2 / (n_layers * sqrt(d_model)).
        fn = partial(nn.init.normal_, mean=0.0, std=small_std)
        return fn, n_layers / math.sqrt(10)
    elif name == "kaiming_normal_":
        fn = partial(nn.init.kaiming_normal_, a=cfg.init_gain, mode=cfg.fan_mode, nonlinearity=cfg.init_nonlinearity)
    elif name == "kaiming_uniform_":
        fn = partial(nn.init.kaiming_uniform_, a=cfg.init_gain, mode=cfg.fan_mode, nonlinearity=cfg.init_nonlinearity)
    elif name in ("xavier_normal_", "xavier_uniform_"):
        # A gain of 0 (llm-foundry's default init_gain) would zero the weights: validation rejects it.
        fn = partial(getattr(nn.init, name), gain=cfg.init_gain)
    else:
        raise ValueError(f"unknown init_config.name {name!r}")

    div = cfg.init_div_is_residual
    if div is True:
        div = math.sqrt(2 * n_layers)
    elif div is False:
        div = 1.0
    return fn, float(div)


@torch.no_grad()
def init_module(module: nn.Module, arch) -> None:
    """Initialise the parameters that ``module`` owns directly (not its children)."""
    cfg = arch.init_config
    if cfg.name == "default_" and isinstance(module, (nn.Linear, nn.Embedding)):
        # llm-foundry's default_: each layer's own torch init (reset_parameters); no residual scaling, and the
        # embedding options are not read
        module.reset_parameters()
        return
    if isinstance(module, nn.Linear):
        fn, div = _weight_init_fn(cfg, arch.d_model, arch.n_layers)
        splits = getattr(module, "_fused_splits", None)
        if splits:
            for part in module.weight.split(splits, dim=0):
                fn(part)
        else:
            fn(module.weight)
        if getattr(module, "_is_residual", False):
            module.weight.div_(div)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        if cfg.emb_init_std is not None:
            nn.init.normal_(module.weight, mean=0.0, std=cfg.emb_init_std)
        elif cfg.emb_init_uniform_lim is not None:
            lim = cfg.emb_init_uniform_lim
            low, high = (-lim, lim) if isinstance(lim, (int, float)) else lim
            nn.init.uniform_(module.weight, low, high)
        else:
            fn, _ = _weight_init_fn(cfg, arch.d_model, arch.n_layers)
            fn(module.weight)
    elif isinstance(module, (LayerNorm, RMSNorm, nn.LayerNorm)):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
