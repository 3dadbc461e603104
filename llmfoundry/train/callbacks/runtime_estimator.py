"""runtime_estimator: seconds left in training, from the average time of the batches run so far."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback


@dataclass
class RuntimeEstimatorSettings:
    skip_batches: int = option(1, "leave the first batches (compilation, warm-up) out of the average")


class RuntimeEstimator(Callback):
    def __init__(self, settings: RuntimeEstimatorSettings):
        self.skip = max(0, settings.skip_batches)
        self.start: tuple[float, int] | None = None
        self.seen = 0

    def on_fit_start(self, trainer):
        self.start, self.seen = None, 0

    def on_batch_end(self, trainer, metrics):
        self.seen += 1
        now = time.perf_counter()
        if self.seen == self.skip or (self.skip == 0 and self.start is None):
            self.start = (now, trainer.time.batch)
            if self.skip:
                return
        if self.start is None:
            return
        t0, b0 = self.start
        done = trainer.time.batch - b0
        if done <= 0:
            return
        per_batch = (now - t0) / done
        remaining = max(0, trainer.max_batches - trainer.time.batch)
        metrics["time/remaining_estimate"] = per_batch * remaining
        metrics["time/seconds_per_batch"] = per_batch


@callbacks.register("runtime_estimator", config=RuntimeEstimatorSettings)
def build_runtime_estimator(settings: RuntimeEstimatorSettings) -> Callback:
    return RuntimeEstimator(settings)
