"""Optimizers by name: decoupled_adamw, adamw, decoupled_lionw, clip_lion, adalr_lion, no_op (llm-foundry's names).

clip_lion and adalr_lion are llm-foundry's outlier-aware Lion variants: each parameter keeps a history of a norm
(of its gradient, or of its new momentum) and compares each new value with the mean of the values seen between
2 * 500 and 500 observations ago. clip_lion rescales an outlier gradient to threshold * that mean; adalr_lion
multiplies the parameter's learning rate by lr_penalty per outlier of the last `timeout` steps. The history is
kept in tensors, so it is saved in and restored from checkpoints with the rest of the optimizer state.

The names are declared in train/catalog.py and their settings live in train/optim_settings.py.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.optim_settings import (
    AdaLRLionSettings,
    ClipLionSettings,
    DecoupledAdamSettings,
    LionSettings,
    NoOpSettings,
    TorchAdamSettings,
)


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


def build_decoupled_adamw(settings: DecoupledAdamSettings, model: nn.Module) -> torch.optim.Optimizer:
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
    return _adamw(groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps,
                  amsgrad=getattr(settings, "amsgrad", False))


def build_adamw(settings: TorchAdamSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return _adamw(groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps,
                  weight_decay=settings.weight_decay, amsgrad=getattr(settings, "amsgrad", False))


FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # what torch's fused AdamW takes


def adamw_kernel(params: list[torch.Tensor]) -> bool | None:
    """torch AdamW's ``fused`` option for these parameters: True (one kernel per device and dtype, no per-tensor
    launches) when every one is a floating CUDA tensor (an FSDP2 shard included); otherwise None, torch's default:
    foreach on CUDA, the per-tensor loop on CPU, which keeps CPU results bitwise as they were.

    Fused AdamW computes the same update (decay by lr * weight_decay first, then Adam's step) but rounds in other
    places, so its parameters may differ from foreach's in the last bits (about 1 ulp per step, growing over a run).
    """
    if params and all(p.device.type == "cuda" and p.dtype in FUSED_DTYPES for p in params):
        return True
    return None


def _adamw(groups: list[dict], **options) -> torch.optim.Optimizer:
    params = [p for group in groups for p in group["params"]]
    optimizer = torch.optim.AdamW(groups, fused=adamw_kernel(params), **options)
    optimizer.register_load_state_dict_post_hook(_keep_kernel)
    return optimizer


def _keep_kernel(optimizer: torch.optim.Optimizer) -> None:
    """A checkpoint's parameter groups carry the kernel it was written with (fused on a GPU, not on a CPU): keep the
    one chosen for where the parameters are now, with the step counts where that kernel reads them (fused: on the
    parameter's device; otherwise on the CPU, where reading them needs no device sync)."""
    fused = adamw_kernel([p for group in optimizer.param_groups for p in group["params"]])
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = fused, None
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and not group.get("capturable", False):
                optimizer.state[p]["step"] = step.to(p.device if fused else "cpu")


def _lion_update(p, grad, exp_avg, lr: float, initial_lr: float, wd: float, beta1: float, beta2: float) -> None:
    """One Lion step: decay by wd * lr / lr_0, move by -lr * sign(lerp(m, g, 1 - beta1)), then m = lerp(m, g,
    1 - beta2)."""
    if wd != 0:
        p.mul_(1 - wd * (lr / initial_lr if initial_lr else 1.0))
    p.add_(exp_avg.lerp(grad, 1 - beta1).sign_(), alpha=-lr)
    exp_avg.lerp_(grad, 1 - beta2)


def _global_norm(t: torch.Tensor) -> float:
    """L2 norm of a whole tensor: an FSDP2 shard (DTensor) is reduced over its mesh; a plain tensor is whole."""
    norm = torch.linalg.vector_norm(t)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


DELAY = 500  # llm-foundry's OutlierDetector: the mean of observations 2 * DELAY to DELAY steps old


def _observe(state: dict, value: float) -> float | None:
    """Record one norm in the parameter's history; returns the delayed mean it is compared with (None at first)."""
    if "norm_history" not in state:
        state["norm_history"] = torch.zeros(2 * DELAY, dtype=torch.float64)
        state["observations"] = torch.zeros((), dtype=torch.int64)
    n = int(state["observations"]) + 1  # this is observation number n
    state["norm_history"][(n - 1) % (2 * DELAY)] = value
    state["observations"].fill_(n)
    if n <= DELAY:
        return None
    first, last = max(1, n - 2 * DELAY + 1), n - DELAY  # the delayed window, as observation numbers
    slots = (torch.arange(first, last + 1) - 1) % (2 * DELAY)
    return float(state["norm_history"][slots].mean())


# The outlier history and its counters, in the dtypes they are kept in: torch's load_state_dict would cast them to the
# parameters' dtype (bf16 counts only to 256), so they are set aside before it and restored after it.
HISTORY = {"norm_history": torch.float64, "observations": torch.int64, "outliers": torch.bool,
           "clipped_batches": torch.float32}


def _set_aside_history(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    order = [i for group in state_dict["param_groups"] for i in group["params"]]
    optimizer._history = [{k: v for k, v in state_dict["state"].get(i, {}).items() if k in HISTORY} for i in order]
    state = {i: {k: v for k, v in values.items() if k not in HISTORY} for i, values in state_dict["state"].items()}
    return {**state_dict, "state": state}


def _restore_history(optimizer: torch.optim.Optimizer) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p, history in zip(params, optimizer.__dict__.pop("_history", [])):
        for key, value in history.items():
            optimizer.state[p][key] = value.to(device="cpu", dtype=HISTORY[key])


class DecoupledLionW(torch.optim.Optimizer):
    """Lion (sign of an interpolated momentum) with weight decay scaled by lr_t / lr_0 like decoupled AdamW."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.register_load_state_dict_pre_hook(_set_aside_history)
        self.register_load_state_dict_post_hook(_restore_history)

    def _lr(self, p, grad, state: dict, lr: float, beta2: float) -> float:
        return lr

    def _grad(self, p, grad, state: dict) -> torch.Tensor:
        return grad

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                grad = self._grad(p, p.grad, state)
                lr = self._lr(p, grad, state, group["lr"], beta2)
                _lion_update(p, grad, state["exp_avg"], lr, group["initial_lr"], group["weight_decay"], beta1, beta2)
        return loss


class DecoupledClipLion(DecoupledLionW):
    """Lion that rescales a parameter's outlier gradient (norm > threshold * delayed mean) to that bound."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float, outlier_threshold: float):
        super().__init__(params, lr, betas, weight_decay)
        self.outlier_threshold = outlier_threshold

    def _grad(self, p, grad, state: dict) -> torch.Tensor:
        if "clipped_batches" not in state:
            state["clipped_batches"] = torch.zeros(())
        norm = _global_norm(grad)
        mean = _observe(state, norm)
        if mean is not None and norm > self.outlier_threshold * mean:
            state["clipped_batches"] += 1.0
            grad = grad * (self.outlier_threshold * mean / norm)
        return grad


class DecoupledAdaLRLion(DecoupledLionW):
    """Lion that lowers a parameter's lr by lr_penalty per outlier momentum norm in the last `timeout` steps."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float, outlier_threshold: float,
                 timeout: int, lr_penalty: float, min_scale: float):
        super().__init__(params, lr, betas, weight_decay)
        self.outlier_threshold, self.timeout = outlier_threshold, timeout
        self.lr_penalty, self.min_scale = lr_penalty, min_scale

    def _lr(self, p, grad, state: dict, lr: float, beta2: float) -> float:
        if "outliers" not in state:  # outliers[s % (timeout + 1)]: whether step s (of the last timeout + 1) had one
            state["outliers"] = torch.zeros(self.timeout + 1, dtype=torch.bool)
            state["step"] = torch.zeros((), dtype=torch.int64)
        norm = _global_norm(state["exp_avg"].lerp(grad, 1 - beta2))  # the momentum this step would make
        mean = _observe(state, norm)
        step = int(state["step"])
        state["outliers"][step % (self.timeout + 1)] = mean is not None and norm > self.outlier_threshold * mean
        state["step"].fill_(step + 1)
        return lr * max(self.min_scale, self.lr_penalty ** int(state["outliers"].sum()))


class NoOp(torch.optim.Optimizer):
    """Leaves every parameter as it is (llm-foundry's no_op: e.g. to measure throughput without updates)."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.0})

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                return closure()
        return None


def build_decoupled_lionw(settings: LionSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return DecoupledLionW(groups, lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay)


def build_clip_lion(settings: ClipLionSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return DecoupledClipLion(groups, lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay,
                             outlier_threshold=settings.outlier_threshold)


def build_adalr_lion(settings: AdaLRLionSettings, model: nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(settings, model, "optimizer")
    return DecoupledAdaLRLion(groups, lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay,
                              outlier_threshold=settings.outlier_threshold, timeout=settings.timeout,
                              lr_penalty=settings.lr_penalty, min_scale=settings.min_scale)


def build_no_op(settings: NoOpSettings, model: nn.Module) -> torch.optim.Optimizer:
    return NoOp([p for p in model.parameters() if p.requires_grad])
