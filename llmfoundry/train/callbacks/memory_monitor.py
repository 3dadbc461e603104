"""memory_monitor: device memory after each batch (CUDA allocator statistics; process memory on CPU), in GB."""

from __future__ import annotations

import resource
from dataclasses import dataclass

import torch

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback

GB = 1024**3


@dataclass
class MemoryMonitorSettings:
    interval: int = option(1, "log every this many batches")


def memory_metrics(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        return {
            "memory/allocated_mem": stats.get("allocated_bytes.all.current", 0) / GB,
            "memory/active_mem": stats.get("active_bytes.all.current", 0) / GB,
            "memory/reserved_mem": stats.get("reserved_bytes.all.current", 0) / GB,
            "memory/peak_allocated_mem": stats.get("allocated_bytes.all.peak", 0) / GB,
            "memory/alloc_retries": float(stats.get("num_alloc_retries", 0)),
        }
    metrics = {"memory/peak_rss_mem": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB}
    try:
        with open("/proc/self/statm") as f:
            metrics["memory/rss_mem"] = int(f.read().split()[1]) * resource.getpagesize() / GB
    except OSError:
        pass
    return metrics


class MemoryMonitor(Callback):
    def __init__(self, settings: MemoryMonitorSettings):
        self.interval = max(1, settings.interval)

    def on_batch_end(self, trainer, metrics):
        if trainer.time.batch % self.interval == 0:
            metrics.update(memory_metrics(trainer.device))


@callbacks.register("memory_monitor", config=MemoryMonitorSettings)
def build_memory_monitor(settings: MemoryMonitorSettings) -> Callback:
    return MemoryMonitor(settings)
