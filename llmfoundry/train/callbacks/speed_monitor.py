"""speed_monitor: throughput (batches, samples, tokens per second) and, on known GPUs, TFLOP/s and MFU.

MFU = achieved model FLOP/s per device / the device's dense bf16 peak. Model FLOPs come from the model's
``flops_per_token(seq_len)`` (6N + 12·L·d·T for training). Peaks: A100 312, H100/H200 989 TFLOP/s; on a CPU or an
unknown device no MFU is reported unless ``peak_tflops`` is given.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def device_peak_tflops(device: torch.device) -> float | None:
    """Dense bf16 peak of ``device`` in TFLOP/s, or None when unknown (CPUs included)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_TFLOPS.items():
        if key in name:
            return peak
    return None


@dataclass
class SpeedMonitorSettings:
    window_size: int = option(100, "average throughput over this many batches")
    peak_tflops: float | None = option(None, "per-device peak TFLOP/s for MFU (default: from the device name)")


class SpeedMonitor(Callback):
    def __init__(self, settings: SpeedMonitorSettings):
        self.settings = settings
        self.window: deque[tuple[float, int, int]] = deque(maxlen=settings.window_size + 1)  # (time, samples, tokens)
        self.flops_per_token = 0.0
        self.peak: float | None = None

    def on_fit_start(self, trainer):
        self.flops_per_token = float(trainer.model.flops_per_token(trainer.cfg.max_seq_len))
        self.peak = self.settings.peak_tflops or device_peak_tflops(trainer.device)
        self.window.clear()

    def on_batch_end(self, trainer, metrics):
        now = time.perf_counter()
        self.window.append((now, trainer.time.sample, trainer.time.token))
        if len(self.window) < 2:
            return  # the first batch only starts the clock (it includes warm-up)
        (t0, s0, k0), (t1, s1, k1) = self.window[0], self.window[-1]
        seconds = max(t1 - t0, 1e-9)
        batches = len(self.window) - 1
        world = trainer.dist.world_size
        tokens_per_s = (k1 - k0) / seconds
        metrics["throughput/batches_per_sec"] = batches / seconds
        metrics["throughput/samples_per_sec"] = (s1 - s0) / seconds
        metrics["throughput/tokens_per_sec"] = tokens_per_s
        metrics["throughput/device/samples_per_sec"] = (s1 - s0) / seconds / world
        metrics["throughput/device/tokens_per_sec"] = tokens_per_s / world
        flops = tokens_per_s * self.flops_per_token / world
        metrics["throughput/device/tflops_per_sec"] = flops / 1e12
        if self.peak:
            metrics["throughput/device/mfu"] = flops / (self.peak * 1e12)


@callbacks.register("speed_monitor", config=SpeedMonitorSettings)
def build_speed_monitor(settings: SpeedMonitorSettings) -> Callback:
    return SpeedMonitor(settings)
