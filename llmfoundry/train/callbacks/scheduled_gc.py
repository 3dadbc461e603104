"""scheduled_gc (llm-foundry's ScheduledGarbageCollector): Python's automatic garbage collection is off during
training, so that its pauses do not strike ranks at different times; a full collection (and, on CUDA, a release of
cached blocks) runs every ``batch_interval`` batches, a generation-1 collection every ``gen_1_batch_interval``.
Collection is on again during evaluation unless ``eval_keep_disabled``, and as it was after training.
"""

from __future__ import annotations

import gc

import torch

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import ScheduledGCSettings
from llmfoundry.train.state import TrainState


def collect() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class ScheduledGC(Callback):
    def __init__(self, settings: ScheduledGCSettings):
        self.s = settings
        self.was_enabled: bool | None = None
        self.collections = 0  # full collections run by this callback

    def on_fit_start(self, state: TrainState):
        self.was_enabled = gc.isenabled()
        gc.disable()
        collect()

    def on_batch_start(self, state: TrainState):
        batch = state.time.batch  # batches done, as Composer's timestamp before the dataloader
        if self.s.gen_1_batch_interval is not None and batch % self.s.gen_1_batch_interval == 0:
            gc.collect(1)
        if batch % self.s.batch_interval == 0:
            collect()
            self.collections += 1

    def on_eval_start(self, state: TrainState):
        collect()
        if not self.s.eval_keep_disabled:
            gc.enable()

    def on_eval_end(self, state: TrainState, metrics):
        if not self.s.eval_keep_disabled and self.was_enabled is not None:  # eval_first runs inside fit too
            gc.disable()
        collect()

    def on_fit_end(self, state: TrainState):
        collect()
        if self.was_enabled:
            gc.enable()
        else:
            gc.disable()


def build_scheduled_gc(settings: ScheduledGCSettings) -> Callback:
    return ScheduledGC(settings)
