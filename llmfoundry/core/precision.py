"""Numeric precision: the one map of dtype names, and the policies fp32, amp_bf16, amp_fp16 (autocast) and bf16
(weights in bf16)."""

from __future__ import annotations

import contextlib

import torch

from llmfoundry.core.dtype_names import DTYPE_NAMES

DTYPES = {name: getattr(torch, torch_name) for name, torch_name in DTYPE_NAMES.items()}
AUTOCAST_DTYPES = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}


def autocast(precision: str, device: torch.device):
    """The context in which forward passes run."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def weight_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def low_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype a policy computes in (bf16 for amp_bf16 and bf16, fp16 for amp_fp16); None for fp32."""
    return torch.bfloat16 if precision == "bf16" else AUTOCAST_DTYPES.get(precision)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 gradients underflow without loss scaling; the other policies need none."""
    if precision != "amp_fp16":
        return None
    return torch.amp.GradScaler(device.type)


def bf16_supported(device: torch.device) -> bool:
    """Whether amp_bf16 can run as llm-foundry runs it: on a CUDA GPU with bf16 support."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def supported_precision(precision: str, device: torch.device, doing: str = "trains") -> tuple[str, str | None]:
    """(the policy this device runs, a one-line notice or None). amp_bf16 (llm-foundry's default) falls back to
    fp32 where there is no bf16 GPU (llm-foundry refuses to run there). ``doing``: the run's verb in the notice."""
    if precision != "amp_bf16" or bf16_supported(device):
        return precision, None
    where = "a GPU without bf16" if device.type == "cuda" else f"{device.type} (no CUDA GPU)"
    return "fp32", (f"precision: amp_bf16 (llm-foundry's default) needs a CUDA GPU with bf16; this run is on "
                    f"{where}, so it {doing} in fp32 (set precision: fp32 to say so)")
