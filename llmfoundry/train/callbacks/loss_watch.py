"""Watching the training loss: nan_monitor (Composer's NaNMonitor) and kill_loss_spike (llm-foundry's KillLossSpike).

nan_monitor stops the run with an error when the batch's loss is NaN, before the optimizer applies that batch.

kill_loss_spike keeps a window of recent losses. Once the window is full, a loss at least ``outlier_multiplier``
times the window's mean is an outlier; more than ``patience`` outliers in a row are a loss spike. After two windows
of batches, half a window of losses above ``loss_cap`` are "persistently high losses". With ``log_only`` both are
a warning in the log; otherwise the run stops with an error. As in llm-foundry, a ``window_size`` left at its
default grows to 5% of the run's batches when the window first fills, and a ``loss_cap`` left at its default
becomes the largest loss of the first window (at most 10).
"""

from __future__ import annotations

import logging
import math
from collections import deque

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import MAX_LOSS_CAP, MIN_WINDOW_SIZE, KillLossSpikeSettings, NaNMonitorSettings
from llmfoundry.train.errors import TrainingStopped
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)
WINDOW_FRACTION = 0.05  # llm-foundry's rule: a default window grows to this fraction of the run's batches


class NaNMonitor(Callback):
    def should_skip_step(self, state: TrainState, loss):
        if math.isnan(loss):
            raise TrainingStopped(f"nan_monitor: the training loss is NaN at batch {state.time.batch + 1} (lower "
                                  "the learning rate, add gradient_clipping, or resume from an earlier checkpoint)")
        return False


class KillLossSpike(Callback):
    def __init__(self, settings: KillLossSpikeSettings):
        self.s = settings
        self.window_size = settings.window_size
        self.loss_cap = settings.loss_cap
        self.window: deque[float] = deque()
        self.outliers = 0
        self.window_size_set = settings.window_size != MIN_WINDOW_SIZE
        self.loss_cap_set = settings.loss_cap != MAX_LOSS_CAP
        self.events: list[str] = []  # what was detected, in order (also logged)

    def on_batch_end(self, state: TrainState, metrics):
        loss = float(metrics["loss/train/total"])  # read every batch (a device sync), only when this callback runs
        step = state.time.batch
        if len(self.window) == self.window_size:
            if not self.window_size_set:
                self.window_size = max(self.window_size, round(state.rates.max_duration_batches * WINDOW_FRACTION))
                self.window = deque(self.window, maxlen=self.window_size)
                self.window_size_set = True
                if self.window_size > MIN_WINDOW_SIZE:  # keep filling the larger window first
                    self.window.append(loss)
                    return
            if not self.loss_cap_set and step == self.window_size:
                self.loss_cap = min(max(self.window), self.loss_cap)
                self.loss_cap_set = True
            mean = sum(self.window) / len(self.window)
            if self._spike(loss, mean):
                self._report(state, f"loss spike: {self.outliers} losses in a row at least "
                                      f"{self.s.outlier_multiplier:g}x the running mean {mean:.4g} (try a lower "
                                      "learning rate)")
            elif self._high_losses(step):
                self._report(state, f"high losses: at least half of the last {self.window_size} losses are above "
                                      f"{self.loss_cap:.4g}")
        if self.window.maxlen is None:
            self.window = deque(self.window, maxlen=self.window_size)
        self.window.append(loss)

    def _spike(self, loss: float, mean: float) -> bool:
        if loss >= mean * self.s.outlier_multiplier:
            self.outliers += 1
            return self.outliers > self.s.patience
        self.outliers = 0
        return False

    def _high_losses(self, step: int) -> bool:
        if step < self.window_size * 2:
            return False
        return sum(1 for loss in self.window if loss > self.loss_cap) >= self.window_size / 2

    def _report(self, state: TrainState, what: str) -> None:
        where = f"kill_loss_spike: {what} at batch {state.time.batch}"
        self.events.append(where)
        if not self.s.log_only:
            raise TrainingStopped(f"{where} (resume from an earlier checkpoint; callbacks.kill_loss_spike.log_only: "
                                  "true only warns)")
        log.warning("%s", where)
        state.print(where)


def build_nan_monitor(settings: NaNMonitorSettings) -> Callback:
    return NaNMonitor()


def build_kill_loss_spike(settings: KillLossSpikeSettings) -> Callback:
    return KillLossSpike(settings)
