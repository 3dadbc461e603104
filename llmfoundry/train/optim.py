"""Optimizers by name: decoupled_adamw, decoupled_lionw, adamw."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from llmfoundry.config.checks import Betas, NonNegativeFloat, PositiveFloat
from llmfoundry.config.fields import option
from llmfoundry.core.errors import ConfigError
from llmfoundry.registry import optimizers


@dataclass
class ParamGroup:
    param_str_match: str = option(doc="regular expression; parameters whose names match join this group")
    lr: NonNegativeFloat | None = option(None, "learning rate of the group (default: the optimizer's)")
    weight_decay: NonNegativeFloat | None = option(None, "weight decay of the group (default: the optimizer's)")


@dataclass
class AdamSettings:
    lr: NonNegativeFloat = option(1e-4, "peak learning rate")
    betas: Betas = option([0.9, 0.95], "Adam beta1, beta2")
    eps: PositiveFloat = option(1e-8, "Adam epsilon")
    weight_decay: NonNegativeFloat = option(0.0, "weight decay")
    param_groups: list[ParamGroup] = option(default_factory=list, doc="per-parameter-name overrides")
    disable_grad: str | list[str] | None = option(None, "regex (or list): matching parameters are frozen")


@dataclass
class LionSettings:
    lr: NonNegativeFloat = option(1e-4, "peak learning rate")
    betas: Betas = option([0.9, 0.99], "Lion beta1 (update interpolation), beta2 (momentum decay)")
    weight_decay: NonNegativeFloat = option(0.0, "decoupled weight decay")
    param_groups: list[ParamGroup] = option(default_factory=list, doc="per-parameter-name overrides")
    disable_grad: str | list[str] | None = option(None, "regex (or list): matching parameters are frozen")


def _param_groups(settings, model: nn.Module, key: str) -> list[dict]:
    """Parameters split into groups by the first matching param_groups regex; frozen ones left out."""
    patterns = settings.disable_grad
    frozen = [patterns] if isinstance(patterns, str) else list(patterns or [])
    groups: list[dict] = [{"params": []} for _ in range(len(settings.param_groups) + 1)]
    for name, param in model.named_parameters():
        if any(re.search(p, name) for p in frozen):
            param.requires_grad_(False)
        if not param.requires_grad:
            continue
        for i, group in enumerate(settings.param_groups):
            if re.search(group.param_str_match, name):
                groups[i + 1]["params"].append(param)
                break
        else:
            groups[0]["params"].append(param)
    for i, group in enumerate(settings.param_groups):
        if not groups[i + 1]["params"]:
            raise ConfigError(f"{key}.param_groups[{i}].param_str_match: '{group.param_str_match}' matches no parameter")
        for attr in ("lr", "weight_decay"):
            if getattr(group, attr) is not None:
                groups[i + 1][attr] = getattr(group, attr)
    if not any(g["params"] for g in groups):
        raise ConfigError(f"{key}: no trainable parameters (check disable_grad)")
    return [g for g in groups if g["params"]]


@optimizers.register("decoupled_adamw", config=AdamSettings)
def build_decoupled_adamw(settings: AdamSettings, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW whose weight decay follows the schedule but not the size of the learning rate.

    torch's AdamW shrinks weights by lr_t * wd each step. Decoupled weight decay shrinks them by
    wd * lr_t / lr_0, so `weight_decay` means the same thing whatever the learning rate. With a constant lr_0
    that is exactly AdamW with weight_decay = wd / lr_0, which keeps torch's fused/foreach kernels.
    """
    groups = _param_groups(settings, model, "optimizer")
    for group in groups:
        lr = group.get("lr", settings.lr)
        wd = group.get("weight_decay", settings.weight_decay)
        group["weight_decay"] = wd / lr if lr > 0 else 0.0
    return torch.optim.AdamW(groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps)


@optimizers.register("adamw", config=AdamSettings)
def build_adamw(settings: AdamSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return torch.optim.AdamW(groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps,
                             weight_decay=settings.weight_decay)


class DecoupledLionW(torch.optim.Optimizer):
    """Lion (sign of an interpolated momentum) with weight decay scaled by lr_t / lr_0 like decoupled AdamW."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            decay = 1 - wd * lr / group["initial_lr"] if group["initial_lr"] > 0 else 1.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                momentum = state["exp_avg"]
                if decay != 1.0:
                    p.mul_(decay)
                update = momentum.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


@optimizers.register("decoupled_lionw", config=LionSettings)
def build_decoupled_lionw(settings: LionSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return DecoupledLionW(groups, lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay)
