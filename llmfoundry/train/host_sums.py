"""Sums over ranks of numbers the host already knows (a batch's token count, its FLOPs), without the device.

Summing them in a device tensor (NCCL) would need a device-to-host read of the result: a sync that stalls the
loop. A gloo group sums them on the host instead: the ranks meet, but nothing waits for the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

from llmfoundry.core import dist

_host_group: tuple[Any, Any] | None = None  # (the default group it was made for, the gloo group)


def host_group():
    """A process group for CPU tensors: the default one when it runs gloo, else a gloo group of every rank, made the
    first time (every rank must call this at the same point: the trainer does when it is built)."""
    global _host_group
    if not tdist.is_initialized():
        return None
    world = tdist.group.WORLD
    if "gloo" in str(tdist.get_backend()):
        return None
    if _host_group is None or _host_group[0] is not world:
        _host_group = (world, dist.new_gloo_group())
    return _host_group[1]


def host_sum(value, dtype: torch.dtype = torch.int64):
    """``value`` (an int, or a float with dtype float64) summed over every rank, on the host."""
    return host_sums([value], dtype)[0]


def host_sums(values: list, dtype: torch.dtype = torch.int64) -> list:
    """Each of ``values`` (ints, or floats with dtype float64) summed over every rank, on the host, in one
    collective."""
    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=dtype)
    with dist.collective("all_reduce (sum) of host numbers"):
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM, group=host_group())
    return tensor.tolist()


def batch_sums(local_tokens: int, callbacks: list, state) -> dict[str, float]:
    """A batch's host numbers summed over every rank in one collective: this rank's token count ("tokens") and what
    each callback asks for (``Callback.host_numbers``: speed_monitor's FLOPs). float64 sums: token counts stay
    exact below 2**53."""
    numbers = {"tokens": float(local_tokens)}
    for callback in callbacks:
        ask = getattr(callback, "host_numbers", None)  # callbacks written against the events alone have none
        for name, value in ((ask(state) if ask is not None else None) or {}).items():
            if name in numbers:
                raise ValueError(f"{type(callback).__name__}.host_numbers: '{name}' is already summed this batch "
                                 "(name the numbers after the callback)")
            numbers[name] = float(value)
    return dict(zip(numbers, host_sums(list(numbers.values()), torch.float64)))
