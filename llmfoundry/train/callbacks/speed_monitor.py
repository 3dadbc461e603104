"""speed_monitor: Composer's SpeedMonitor: throughput over a rolling window, model FLOP/s and MFU, wall-clock time.

Once ``window_size`` batches have run after the first one (the window then holds window_size + 1 batch ends), every
batch logs throughput/{batches,samples,tokens}_per_sec and throughput/device/... (divided by the world size),
throughput/flops_per_sec, throughput/device/flops_per_sec and, when the device's peak is known or
``gpu_flops_available`` is given, throughput/device/mfu. Model FLOPs of a batch are the model's
``flops_per_token(seq_len)`` (6N + 12·L·d·T) times the batch's input_ids size (padding included, as llm-foundry's
``flops_per_batch`` counts them), summed over ranks. Every batch also logs time/train, time/val and time/total in
``time_unit``: evaluation time counts as time/val, everything else since fit start as time/train.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import SECONDS_PER_UNIT, SpeedMonitorSettings
from llmfoundry.train.state import TrainState

# Dense peak FLOP/s per device family and trainer precision, as Composer's table has them (datasheets' sparse
# figures halved). fp32 is plain fp32, not TF32. amp_fp8's MFU is against the float8 peak, as Composer reports it
# (llm-foundry's amp_fp8): the same run's bf16-peak figure is twice as high.
_H100_SXM = {"fp32": 67e12, "amp_bf16": 989.5e12, "amp_fp16": 989.5e12, "bf16": 989.5e12, "amp_fp8": 1979e12}
PEAK_FLOPS = {
    "h200-sxm": _H100_SXM,
    "h100-sxm": _H100_SXM,
    "h100-pcie": {"fp32": 51e12, "amp_bf16": 756.5e12, "amp_fp16": 756.5e12, "bf16": 756.5e12, "amp_fp8": 1513e12},
    "a100": {"fp32": 19.5e12, "amp_bf16": 312e12, "amp_fp16": 312e12, "bf16": 312e12},
    "a10": {"fp32": 31.2e12, "amp_bf16": 125e12, "amp_fp16": 125e12, "bf16": 125e12},
    "v100-sxm": {"fp32": 15.7e12, "amp_fp16": 125e12},
    "v100-pcie": {"fp32": 14e12, "amp_fp16": 112e12},
    "t4": {"fp32": 8.1e12, "amp_fp16": 65e12},
}


def device_family(name: str) -> str | None:
    """The PEAK_FLOPS family of a CUDA device name (Composer's matching rules), or None."""
    name = name.lower()
    if "h200" in name:
        return "h200-sxm"
    if "h100" in name and "hbm3" in name:
        return "h100-sxm"
    if "h100" in name and ("pcie" in name or "hbm2e" in name):
        return "h100-pcie"
    for family in ("a100", "a10", "v100-sxm", "v100-pcie", "t4"):  # a100 before a10: "a10" is in "a100"
        if family in name:
            return family
    return None


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Dense peak FLOP/s of ``device`` at ``precision``, or None when unknown (CPUs included)."""
    if device.type != "cuda":
        return None
    family = device_family(torch.cuda.get_device_name(device))
    return PEAK_FLOPS.get(family, {}).get(precision) if family else None


def device_peak_tflops(device: torch.device) -> float | None:
    """Dense bf16 peak of ``device`` in TFLOP/s, or None when unknown (CPUs included)."""
    peak = device_peak_flops(device, "amp_bf16")
    return peak / 1e12 if peak else None


class WallClock:
    """Seconds since fit start, split into evaluation and everything else (training, logging, checkpoints)."""

    def __init__(self) -> None:
        self.start = self.mark = time.perf_counter()
        self.eval_seconds = 0.0
        self.eval_start: float | None = None

    def batch_end(self) -> float:
        """Marks a batch end (evaluation starts from here); returns the training seconds so far."""
        self.mark = time.perf_counter()
        return self.mark - self.start - self.eval_seconds

    def eval_started(self) -> None:
        self.eval_start = time.perf_counter()

    def eval_ended(self) -> float:
        """Adds the evaluation that just ended (from on_eval_start, else from the last batch end) and returns it."""
        now = time.perf_counter()
        # the trainer evaluates right after a batch's on_batch_end (or after on_fit_start for eval_first)
        seconds = now - (self.eval_start if self.eval_start is not None else self.mark)
        self.eval_seconds += seconds
        self.eval_start = None
        self.mark = now
        return seconds


class SpeedMonitor(Callback):
    def __init__(self, settings: SpeedMonitorSettings):
        self.settings = settings
        self.divider = SECONDS_PER_UNIT[settings.time_unit]
        # (training seconds, samples, tokens, FLOPs so far) at each of the last window_size + 1 batch ends
        self.window: deque[tuple[float, int, int, float]] = deque(maxlen=settings.window_size + 1)
        self.peak: float | None = None
        self.clock = WallClock()
        self.flops_so_far = 0.0
        self.flops_per_token: dict[int, float] = {}

    def on_fit_start(self, state: TrainState):
        self.peak = self.settings.gpu_flops_available
        if self.peak is None:
            self.peak = device_peak_flops(state.device, state.precision)
            if self.peak is None and state.device.type == "cuda":
                notice_once(f"callbacks.speed_monitor: no peak FLOP/s known for {torch.cuda.get_device_name()} at "
                            f"{state.precision}, so throughput/device/mfu is not logged (set "
                            "gpu_flops_available)")
        if state.time.batch > 0:
            notice_once("callbacks.speed_monitor: time/train, time/val and time/total count from this restart "
                        "(Composer continues them from the checkpoint)")
        self.window.clear()
        self.clock = WallClock()
        self.flops_so_far = 0.0

    def host_numbers(self, state: TrainState) -> dict[str, float]:
        """This rank's model FLOPs of the step: its input_ids size times FLOPs per token, from shapes (no device
        sync); the trainer sums them over ranks with its token count."""
        ids = state.batch["input_ids"]
        seq_len = ids.shape[1]
        if seq_len not in self.flops_per_token:
            self.flops_per_token[seq_len] = float(state.model.flops_per_token(seq_len))
        return {"speed_monitor/flops": self.flops_per_token[seq_len] * ids.numel()}

    def on_batch_end(self, state: TrainState, metrics):
        # the ranks of a tensor-parallel group compute one batch together: it counts once
        self.flops_so_far += state.host_sums["speed_monitor/flops"] / state.data_share.replication
        train_seconds = self.clock.batch_end()
        self.window.append((train_seconds, state.time.sample, state.time.token, self.flops_so_far))
        if len(self.window) == self.window.maxlen:
            metrics.update(self._throughput(state.dist.world_size))
        eval_seconds = self.clock.eval_seconds
        metrics["time/train"] = train_seconds / self.divider
        metrics["time/val"] = eval_seconds / self.divider
        metrics["time/total"] = (train_seconds + eval_seconds) / self.divider

    def _throughput(self, world: int) -> dict[str, float]:
        (t0, s0, k0, f0), (t1, s1, k1, f1) = self.window[0], self.window[-1]
        seconds = max(t1 - t0, 1e-9)
        batches_per_sec = (len(self.window) - 1) / seconds
        samples_per_sec = (s1 - s0) / seconds
        out = {"throughput/batches_per_sec": batches_per_sec, "throughput/samples_per_sec": samples_per_sec,
               "throughput/device/batches_per_sec": batches_per_sec / world,
               "throughput/device/samples_per_sec": samples_per_sec / world}
        if k1 > k0:
            out["throughput/tokens_per_sec"] = (k1 - k0) / seconds
            out["throughput/device/tokens_per_sec"] = (k1 - k0) / seconds / world
        flops_per_sec = (f1 - f0) / seconds
        out["throughput/flops_per_sec"] = flops_per_sec
        out["throughput/device/flops_per_sec"] = flops_per_sec / world
        if self.peak:
            out["throughput/device/mfu"] = flops_per_sec / world / self.peak
        return out

    def on_eval_start(self, state: TrainState):
        self.clock.eval_started()

    def on_eval_end(self, state: TrainState, metrics):
        self.clock.eval_ended()


def build_speed_monitor(settings: SpeedMonitorSettings) -> Callback:
    return SpeedMonitor(settings)
