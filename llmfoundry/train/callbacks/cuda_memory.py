"""CUDA memory snapshots (Composer's MemorySnapshot and OOMObserver). Both need a CUDA device: on a CPU they print
a notice and do nothing, as Composer's warn and disable themselves.

memory_snapshot records the allocator's history for ``interval`` batches after skipping ``skip_batches`` and
writes ``<folder>/<filename>.pickle`` (torch.cuda.memory._snapshot(), for https://pytorch.org/memory_viz) and
``.html`` (its trace plot). oom_observer records the history from the start and, when CUDA runs out of memory,
writes ``<folder>/<filename>_snapshot.pickle`` and the trace, segment and flame-graph views. ``folder`` and
``filename`` may use {run_name}, {rank}, {local_rank}, {world_size}, {epoch}, {batch}, {sample}, {token}.

The allocator keeps one history setting for the whole process, so both callbacks go through HISTORY, which keeps
it on while either needs it (in one run memory_snapshot's file then also holds what oom_observer recorded before
the snapshot's window).
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
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


# How much each history setting of torch.cuda.memory._record_memory_history records, least first.
_LEVELS = {"enabled": ["state", "all"], "context": [None, "state", "alloc", "all"], "stacks": ["python", "all"]}


class AllocatorHistory:
    """Who in this process needs the CUDA allocator to record its history, and with which settings.

    The allocator has one setting per process, and turning the history off (``enabled=None``) also clears what was
    recorded: memory_snapshot did that at the end of its window, and oom_observer then had nothing to write when CUDA
    ran out of memory (#30). Here each callback claims the history with the settings it needs and releases it when
    done; what is applied is the most any remaining claim asks for (each setting's highest level, the largest
    ``max_entries``), and the history is turned off only when no claim is left. ``set_history`` stands for
    torch.cuda.memory._record_memory_history (tests pass a recorder of its calls; the allocator needs CUDA)."""

    def __init__(self, set_history=None):
        self.set_history = set_history
        self.claims: dict[object, dict] = {}

    def claim(self, owner: object, enabled: str = "all", context: str | None = "all", stacks: str = "all",
              max_entries: int = 100000) -> None:
        self.claims[owner] = dict(enabled=enabled, context=context, stacks=stacks, max_entries=max_entries)
        self._apply()

    def release(self, owner: object) -> None:
        if self.claims.pop(owner, None) is not None:
            self._apply()

    def settings(self) -> dict | None:
        """What the allocator should record now (None: nothing)."""
        if not self.claims:
            return None
        claims = list(self.claims.values())
        merged = {key: max((c[key] for c in claims), key=levels.index) for key, levels in _LEVELS.items()}
        return dict(merged, max_entries=max(c["max_entries"] for c in claims))

    def _apply(self) -> None:
        set_history = self.set_history or torch.cuda.memory._record_memory_history
        settings = self.settings()
        if settings is None:
            set_history(None)
        else:  # enabling again does not clear the history (clear_history stays False): what was recorded stays
            set_history(**settings)


HISTORY = AllocatorHistory()


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
            self.record()
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
            self.stop()
            self.folder = None  # once per run, as Composer's
            if all(len(trace) == 0 for trace in snapshot["device_traces"]):
                log.info("memory_snapshot: no allocation was recorded")
                return
            self.written = _write(snapshot, {".pickle": None, ".html": _memory_viz.trace_plot}, name)
            state.print(f"memory_snapshot: wrote {name}.pickle and .html")

    def on_fit_end(self, state: TrainState):
        self.stop()  # a run that ends inside the window: stop recording for it all the same

    def record(self) -> None:
        """Record every event with Python and C++ stacks (torch's defaults), as Composer's MemorySnapshot does."""
        HISTORY.claim(self, max_entries=self.s.max_entries)

    def stop(self) -> None:
        """Stop recording for this snapshot: the history goes off only if no other callback (oom_observer) records."""
        HISTORY.release(self)


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
        self.record()  # and on after the run, for an out-of-memory error after it (until stop())
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
                     "_segment_plot.html": _memory_viz.segment_plot}
            if flamegraphs_available():
                views.update({"_segment_flamegraph.svg": _memory_viz.segments,
                              "_memory_flamegraph.svg": _memory_viz.memory})
            else:
                log.warning("oom_observer: no flame graphs: torch draws them with perl and %s, which is not there (it "
                            "would download it; draw them later with python -m torch.cuda._memory_viz memory "
                            "%s_snapshot.pickle -o memory.svg)", FLAMEGRAPH, name)
            self.written = _write(snapshot, views, name)
        except Exception as error:  # noqa: BLE001 - never hide the out-of-memory error behind ours
            log.error("oom_observer: could not write the memory snapshot: %s", error)

    def record(self) -> None:
        """Composer's _record_memory_history(True, trace_alloc_max_entries=..., trace_alloc_record_context=True):
        every event, with the Python stacks of allocations."""
        HISTORY.claim(self, enabled="all", context="alloc", stacks="python", max_entries=self.s.max_entries)

    def stop(self) -> None:
        """Stop recording for this observer: the history goes off only if no other callback records."""
        HISTORY.release(self)


# torch.cuda._memory_viz draws flame graphs with Brendan Gregg's flamegraph.pl from here, and downloads it from
# GitHub when it is missing: inside an out-of-memory handler on a cluster without internet that fails (on the H200
# of #30) or waits for a network timeout, so the observer draws them only when the script is already there.
FLAMEGRAPH = Path("~/.cache/flamegraph.pl").expanduser()


def flamegraphs_available() -> bool:
    return FLAMEGRAPH.exists() and shutil.which("perl") is not None


def _write(snapshot: dict, views: dict, name: Path) -> list[Path]:
    """The pickled snapshot (view None) and each rendered view, at ``name`` + suffix: the files written. A view that
    cannot be drawn is logged and skipped, so it never costs the others (the pickle, written first, holds it all)."""
    written = []
    for suffix, render in views.items():
        path = Path(f"{name}{suffix}")
        try:
            if render is None:
                path.write_bytes(pickle.dumps(snapshot))
            else:
                path.write_text(render(snapshot))
        except Exception as error:  # noqa: BLE001 - one view's renderer failing must not lose the other files
            log.error("could not write %s: %s", path, error)
            path.unlink(missing_ok=True)
            continue
        written.append(path)
    return written


def build_memory_snapshot(settings: MemorySnapshotSettings) -> Callback:
    return MemorySnapshot(settings)


def build_oom_observer(settings: OOMObserverSettings) -> Callback:
    return OOMObserver(settings)
