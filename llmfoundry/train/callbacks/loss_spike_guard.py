"""loss_spike_guard: stop (or skip the optimizer step) when the training loss is NaN/inf or spikes.

A spike is a loss above ``spike_factor`` x the mean of the last ``window`` accepted losses (after ``min_history``
batches). The loss is the global one (all ranks agree), so every rank takes the same decision. With
``action: skip`` the batch's gradients are dropped; after ``max_consecutive_skips`` skipped batches in a row the
run stops anyway, since the model is not recovering.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.errors import TrainingStopped


@dataclass
class LossSpikeGuardSettings:
    action: Literal["stop", "skip"] = option("stop", "stop = end training with an error; skip = drop the batch's update")
    check_nan: bool = option(True, "treat a NaN/inf loss as a spike")
    spike_factor: float | None = option(3.0, "a loss above this multiple of the recent mean is a spike (null = off)")
    window: int = option(20, "number of recent losses in the mean")
    min_history: int = option(5, "no spike detection before this many losses")
    max_consecutive_skips: int = option(5, "with action: skip, stop after this many skipped batches in a row")


class LossSpikeGuard(Callback):
    def __init__(self, settings: LossSpikeGuardSettings):
        self.s = settings
        self.history: deque[float] = deque(maxlen=max(1, settings.window))
        self.skips_in_a_row = 0
        self.skipped = 0

    def _problem(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return f"the training loss is {loss}" if self.s.check_nan else None
        if self.s.spike_factor is not None and len(self.history) >= self.s.min_history:
            mean = sum(self.history) / len(self.history)
            if loss > self.s.spike_factor * mean:
                return (f"the training loss spiked to {loss:.4g}, more than {self.s.spike_factor:g}x the mean "
                        f"{mean:.4g} of the last {len(self.history)} batches")
        return None

    def should_skip_step(self, trainer, loss):
        problem = self._problem(loss)
        if problem is None:
            self.history.append(loss)
            self.skips_in_a_row = 0
            return False
        where = f"at batch {trainer.time.batch + 1}"
        if self.s.action == "stop":
            raise TrainingStopped(f"loss_spike_guard: {problem} {where} (lower the learning rate, add "
                                  "gradient_clipping, resume from an earlier checkpoint, or set "
                                  "callbacks.loss_spike_guard.action: skip)")
        self.skips_in_a_row += 1
        self.skipped += 1
        if self.skips_in_a_row > self.s.max_consecutive_skips:
            raise TrainingStopped(f"loss_spike_guard: {problem} {where}, {self.skips_in_a_row} batches in a row "
                                  "(the run is not recovering; resume from an earlier checkpoint)")
        trainer._print(f"loss_spike_guard: {problem} {where}; skipping this batch")
        return True

    def on_batch_end(self, trainer, metrics):
        metrics["train/skipped_batches"] = float(self.skipped)


@callbacks.register("loss_spike_guard", config=LossSpikeGuardSettings)
def build_loss_spike_guard(settings: LossSpikeGuardSettings) -> Callback:
    return LossSpikeGuard(settings)
