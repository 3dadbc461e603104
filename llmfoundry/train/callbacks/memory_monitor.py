"""memory_monitor: Composer's MemoryMonitor: CUDA allocator statistics after each batch, as memory/<name>.

On a GPU it logs the ``torch.cuda.memory_stats()`` entries that ``memory_keys`` names (Composer's nine by default):
byte counts in gigabytes (1e9 bytes, five significant digits; a logged name's "bytes" becomes "gigabytes"), other
counts as they are. With ``dist_aggregate_batch_interval`` N it also logs <name>_avg, _min and _max over ranks on
batches 1, N+1, 2N+1, ... (Composer's batch indices 0, N, 2N, ...). On a CPU, where Composer logs nothing, it logs
this process's memory instead: memory/rss_mem and memory/peak_rss_mem (GB).
"""

from __future__ import annotations

import math
import resource

import torch

from llmfoundry.core import dist
from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import MemoryMonitorSettings
from llmfoundry.train.state import TrainState

GB = 1e9

DEFAULT_MEMORY_KEYS = {
    "allocated_bytes.all.current": "current_allocated_mem",
    "active_bytes.all.current": "current_active_mem",
    "inactive_split_bytes.all.current": "current_inactive_mem",
    "reserved_bytes.all.current": "current_reserved_mem",
    "allocated_bytes.all.peak": "peak_allocated_mem",
    "active_bytes.all.peak": "peak_active_mem",
    "inactive_split_bytes.all.peak": "peak_inactive_mem",
    "reserved_bytes.all.peak": "peak_reserved_mem",
    "num_alloc_retries": "alloc_retries",
}


def round_significant(value: float, digits: int = 5) -> float:
    if value == 0:
        return 0.0
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))


def cuda_memory_report(stats: dict[str, float], memory_keys: dict[str, str]) -> dict[str, float]:
    """{logged name: value} for the ``memory_keys`` that ``stats`` (torch.cuda.memory_stats()) holds."""
    report = {}
    for torch_name, name in memory_keys.items():
        if torch_name not in stats:
            continue
        if "bytes" in torch_name:
            report[name.replace("bytes", "gigabytes")] = round_significant(stats[torch_name] / GB)
        else:
            report[name] = float(stats[torch_name])
    return report


def process_memory_report() -> dict[str, float]:
    """This process's resident memory now and at its peak, in GB (Linux reports ru_maxrss in KiB)."""
    report = {"peak_rss_mem": round_significant(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB)}
    try:
        with open("/proc/self/statm") as f:
            report["rss_mem"] = round_significant(int(f.read().split()[1]) * resource.getpagesize() / GB)
    except OSError:
        pass
    return report


def aggregate_over_ranks(report: dict[str, float], device: torch.device) -> dict[str, float]:
    """<name>_avg, _min and _max of each value over ranks; a collective, so every rank calls it with the same names."""
    world, rank = dist.world_size(), dist.rank()
    names = sorted(report)
    # every rank writes its row of a zero matrix; the sum over ranks is then every rank's values
    table = torch.zeros(world, len(names), dtype=torch.float64, device=device)
    table[rank] = torch.tensor([report[n] for n in names], dtype=torch.float64, device=device)
    table = dist.all_reduce_sum(table).cpu()
    out = {}
    for i, name in enumerate(names):
        column = table[:, i]
        out[f"{name}_avg"] = float(column.mean())
        out[f"{name}_min"] = float(column.min())
        out[f"{name}_max"] = float(column.max())
    return out


class MemoryMonitor(Callback):
    def __init__(self, settings: MemoryMonitorSettings):
        self.settings = settings
        self.memory_keys = settings.memory_keys or DEFAULT_MEMORY_KEYS

    def on_fit_start(self, state: TrainState):
        if state.device.type == "cuda":
            missing = [k for k in self.memory_keys if k not in torch.cuda.memory_stats(state.device)]
            if missing and self.settings.memory_keys:
                notice_once(f"callbacks.memory_monitor.memory_keys: {', '.join(missing)} not in "
                            "torch.cuda.memory_stats() (not logged, as in Composer)")
        elif self.settings.memory_keys:
            notice_once(f"callbacks.memory_monitor.memory_keys: CUDA allocator statistics; this run is on "
                        f"{state.device.type}, which logs process memory (memory/rss_mem, memory/peak_rss_mem)")

    def on_batch_end(self, state: TrainState, metrics):
        batch = state.time.batch
        every = self.settings.dist_aggregate_batch_interval
        aggregate = every is not None and (batch - 1) % every == 0
        if batch % self.settings.interval != 0 and not aggregate:
            return
        if state.device.type == "cuda":
            report = cuda_memory_report(torch.cuda.memory_stats(state.device), self.memory_keys)
        else:
            report = process_memory_report()
        if aggregate:
            report.update(aggregate_over_ranks(report, state.device))
        metrics.update({f"memory/{name}": value for name, value in report.items()})


def build_memory_monitor(settings: MemoryMonitorSettings) -> Callback:
    return MemoryMonitor(settings)
