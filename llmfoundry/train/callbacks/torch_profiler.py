"""The recipe's ``profiler`` section at work: a torch.profiler stepped once per training batch (see
train.profiling for the settings and the schedule's meaning)."""

from __future__ import annotations

from pathlib import Path
import torch

from llmfoundry.core import dist
from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.profiling import ProfilerConfig
from llmfoundry.train.state import TrainState


class TorchProfiler(Callback):
    """Steps a ``torch.profiler.profile`` once per training batch and writes each recorded cycle's trace."""

    def __init__(self, cfg: ProfilerConfig, run_name: str):
        self.cfg = cfg
        self.run_name = run_name
        self.written: list[Path] = []
        self._profile: torch.profiler.profile | None = None
        self._state: TrainState | None = None  # the run's, for the trace names
        if cfg.json_trace_handler is not None:
            notice_once("profiler.json_trace_handler: Composer's event trace has no counterpart here; the torch "
                        "traces in profiler.torch_prof_folder cover the profiled batches")

    def _format(self, text: str, state: TrainState) -> str:
        return text.format(run_name=self.run_name, rank=dist.rank(), epoch=state.time.epoch,
                           batch=state.time.batch)

    def _write(self, profile: torch.profiler.profile) -> None:
        state = self._state
        path = Path(self._format(self.cfg.torch_prof_folder, state)) / self._format(self.cfg.torch_prof_filename, state)
        if self.cfg.torch_prof_use_gzip and path.suffix != ".gz":
            path = path.with_name(path.name + ".gz")
        if path.exists() and not self.cfg.torch_prof_overwrite:
            raise FileExistsError(f"profiler: trace '{path}' already exists (set profiler.torch_prof_overwrite: "
                                  "true or choose another profiler.torch_prof_folder)")
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(path))
        self.written.append(path)
        keep = self.cfg.torch_prof_num_traces_to_keep
        if keep >= 0:
            while len(self.written) > keep:
                self.written.pop(0).unlink(missing_ok=True)

    def on_fit_start(self, state: TrainState) -> None:
        s = self.cfg.schedule
        self._state = state
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(skip_first=s.skip_first, wait=s.wait, warmup=s.warmup,
                                             active=s.active, repeat=s.repeat),
            on_trace_ready=self._write, record_shapes=self.cfg.torch_prof_record_shapes,
            profile_memory=self.cfg.torch_prof_profile_memory, with_stack=self.cfg.torch_prof_with_stack,
            with_flops=self.cfg.torch_prof_with_flops)
        self._profile.start()

    def on_batch_end(self, state: TrainState, metrics: dict[str, float]) -> None:
        if self._profile is not None:
            self._profile.step()

    def on_fit_end(self, state: TrainState) -> None:
        if self._profile is not None:
            self._profile.stop()
            self._profile = None
