"""Numeric precision: the one map of dtype names, and the policies fp32, amp_bf16, amp_fp16 (autocast), bf16
(weights in bf16) and amp_fp8 (float8 matmuls through torchao in the blocks' Linears, train/float8.py; the rest
as amp_bf16)."""

from __future__ import annotations

import contextlib

import torch

from llmfoundry.core.dtype_names import DTYPE_NAMES
from llmfoundry.core.errors import ConfigError

DTYPES = {name: getattr(torch, torch_name) for name, torch_name in DTYPE_NAMES.items()}
AUTOCAST_DTYPES = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16, "amp_fp8": torch.bfloat16}
FLOAT8_INSTALL = "pip install 'llmfoundry[float8]'"
# float8 tensor-core matmuls (torch._scaled_mm) start with Ada (sm_89: L4, L40S, RTX 4090) and Hopper (sm_90)
FLOAT8_CAPABILITY = (8, 9)


def autocast(precision: str, device: torch.device):
    """The context in which forward passes run."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def weight_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def low_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype a policy computes in (bf16 for amp_bf16, amp_fp8 and bf16, fp16 for amp_fp16); None for
    fp32."""
    return torch.bfloat16 if precision == "bf16" else AUTOCAST_DTYPES.get(precision)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 gradients underflow without loss scaling; the other policies need none."""
    if precision != "amp_fp16":
        return None
    return torch.amp.GradScaler(device.type)


def bf16_supported(device: torch.device) -> bool:
    """Whether amp_bf16 can run as llm-foundry runs it: on a CUDA GPU with bf16 support."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def float8_supported(device: torch.device) -> bool:
    """Whether ``device`` has float8 matmuls: a CUDA GPU of compute capability 8.9 or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FLOAT8_CAPABILITY


def check_float8(device: torch.device) -> None:
    """ConfigError (one line) unless amp_fp8 can train here: float8 hardware first (installing cannot fix that),
    then torchao."""
    if not float8_supported(device):
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            where = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
        else:
            where = f"{device.type} (no CUDA GPU)"
        raise ConfigError(f"precision: amp_fp8 needs a CUDA GPU with float8 matmuls (compute capability "
                          f"{FLOAT8_CAPABILITY[0]}.{FLOAT8_CAPABILITY[1]} or newer: H100, H200, L4, L40S, ...); "
                          f"this run is on {where} (use precision: amp_bf16)")
    try:
        import torchao.float8  # noqa: F401  (an optional dependency: the float8 extra)
    except ImportError:
        raise ConfigError(f"precision: amp_fp8 trains through torchao, which is not installed ({FLOAT8_INSTALL})") \
            from None


def supported_precision(precision: str, device: torch.device, doing: str = "trains") -> tuple[str, str | None]:
    """(the policy this device runs, a one-line notice or None). amp_bf16 (llm-foundry's default) falls back to
    fp32 where there is no bf16 GPU (llm-foundry refuses to run there). amp_fp8 without float8 hardware or torchao
    is a ConfigError: it was asked for to be fast, and silently running slower would hide that.
    ``doing``: the run's verb in the notice."""
    if precision == "amp_fp8":
        check_float8(device)
    if precision != "amp_bf16" or bf16_supported(device):
        return precision, None
    where = "a GPU without bf16" if device.type == "cuda" else f"{device.type} (no CUDA GPU)"
    return "fp32", (f"precision: amp_bf16 (llm-foundry's default) needs a CUDA GPU with bf16; this run is on "
                    f"{where}, so it {doing} in fp32 (set precision: fp32 to say so)")
