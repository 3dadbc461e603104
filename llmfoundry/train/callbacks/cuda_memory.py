"""CUDA memory snapshots (Composer's MemorySnapshot and OOMObserver). Both need a CUDA device: on a CPU they print
a notice and do nothing, as Composer's warn and disable themselves.

memory_snapshot records the allocator's history for ``interval`` batches after skipping ``skip_batches`` and
writes ``<folder>/<filename>.pickle`` (torch.cuda.memory._snapshot(), for https://pytorch.org/memory_viz) and
``.html`` (its trace plot). oom_observer records the history from the start and, when CUDA runs out of memory,
writes ``<folder>/<filename>_snapshot.pickle`` and the trace, segment and flame-graph views. ``folder`` and
``filename`` may use {run_name}, {rank}, {local_rank}, {world_size}, {epoch}, {batch}, {sample}, {token}.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import torch
from torch.cuda import _memory_viz

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.timeunits import Time
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import MemorySnapshotSettings, OOMObserverSettings
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)


def _format(template: str, state: TrainState, key: str) -> str:
    fields = dict(vars(state.time), run_name=state.run_name, rank=dist.rank(), world_size=dist.world_size(),
                  local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(f"{key}: '{template}' names an unknown field ({error}); use "
                          f"{', '.join('{' + name + '}' for name in fields)}") from None


def _prepare_folder(state: TrainState, template: str, overwrite: bool, key: str) -> Path | None:
    """The folder for this run's files, or None (with a notice) when the model is not on a CUDA device."""
    if state.device.type != "cuda":
        notice_once(f"{key}: CUDA memory snapshots need a CUDA device (this run is on {state.device.type}); "
                    "the callback does nothing")
        return None
    folder = Path(_format(template, state, f"{key}.folder"))
    folder.mkdir(parents=True, exist_ok=True)
    if not overwrite and any(folder.iterdir()):
        raise ConfigError(f"{key}.folder: '{folder}' is not empty (empty it, choose another folder, or set "
                          "overwrite: true)")
    return folder


class MemorySnapshot(Callback):
    def __init__(self, settings: MemorySnapshotSettings):
        self.s = settings
        interval = f"{settings.interval}ba" if isinstance(settings.interval, int) else settings.interval
        self.interval = int(Time.parse(interval).value)
        self.to_skip = settings.skip_batches
        self.folder: Path | None = None
        self.started_at: int | None = None
        self.written: list[Path] = []

    def on_fit_start(self, state: TrainState):
        self.folder = _prepare_folder(state, self.s.folder, self.s.overwrite, "callbacks.memory_snapshot")

    def on_batch_start(self, state: TrainState):
        if self.folder is not None and self.started_at is None and self.to_skip == 0:
            torch.cuda.memory._record_memory_history("all", max_entries=self.s.max_entries)
            self.started_at = state.time.batch

    def on_batch_end(self, state: TrainState, metrics):
        if self.folder is None:
            return
        if self.to_skip > 0:
            self.to_skip -= 1
            return
        if self.started_at is not None and state.time.batch == self.started_at + self.interval:
            name = self.folder / _format(self.s.filename, state, "callbacks.memory_snapshot.filename")
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(None)
            self.folder = None  # once per run, as Composer's
            if all(len(trace) == 0 for trace in snapshot["device_traces"]):
                log.info("memory_snapshot: no allocation was recorded")
                return
            self.written = _write(snapshot, {".pickle": None, ".html": _memory_viz.trace_plot}, name)
            state.print(f"memory_snapshot: wrote {name}.pickle and .html")


class OOMObserver(Callback):
    def __init__(self, settings: OOMObserverSettings):
        self.s = settings
        self.folder: Path | None = None
        self.run: TrainState | None = None  # the state the file names are made from
        self.written: list[Path] = []

    def on_fit_start(self, state: TrainState):
        self.folder = _prepare_folder(state, self.s.folder, self.s.overwrite, "callbacks.oom_observer")
        if self.folder is None:
            return
        self.run = state
        torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=self.s.max_entries,
                                                 trace_alloc_record_context=True)
        torch._C._cuda_attach_out_of_memory_observer(self.observe)
        log.info("oom_observer: recording CUDA memory history")

    def observe(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """Called by the CUDA allocator when an allocation fails."""
        log.warning("oom_observer: CUDA out of memory; writing memory snapshots")
        try:
            name = self.folder / _format(self.s.filename, self.run, "callbacks.oom_observer.filename")
            snapshot = torch.cuda.memory._snapshot()
            if all(len(trace) == 0 for trace in snapshot["device_traces"]):
                log.info("oom_observer: no allocation was recorded")
                return
            views = {"_snapshot.pickle": None, "_trace_plot.html": _memory_viz.trace_plot,
                     "_segment_plot.html": _memory_viz.segment_plot, "_segment_flamegraph.svg": _memory_viz.segments,
                     "_memory_flamegraph.svg": _memory_viz.memory}
            self.written = _write(snapshot, views, name)
        except Exception as error:  # noqa: BLE001 - never hide the out-of-memory error behind ours
            log.error("oom_observer: could not write the memory snapshot: %s", error)


def _write(snapshot: dict, views: dict, name: Path) -> list[Path]:
    """The pickled snapshot (view None) and each rendered view, at ``name`` + suffix."""
    written = []
    for suffix, render in views.items():
        path = Path(f"{name}{suffix}")
        if render is None:
            path.write_bytes(pickle.dumps(snapshot))
        else:
            path.write_text(render(snapshot))
        written.append(path)
    return written


def build_memory_snapshot(settings: MemorySnapshotSettings) -> Callback:
    return MemorySnapshot(settings)


def build_oom_observer(settings: OOMObserverSettings) -> Callback:
    return OOMObserver(settings)
