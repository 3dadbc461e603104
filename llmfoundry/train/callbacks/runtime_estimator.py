"""runtime_estimator: Composer's RuntimeEstimator: time/remaining_estimate, the time left in training, in time_unit.

The clock starts at the start of the first batch after ``skip_batches`` (compilation and warm-up left out). The
estimate is the training time per fraction of max_duration so far (evaluation left out) times the fraction left,
plus the evaluations still to come at the average duration of those run so far (the first one left out once there
are several). The unit is also logged once as the hyperparameter time/remaining_estimate_unit.
"""

from __future__ import annotations

import time

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import SECONDS_PER_UNIT, RuntimeEstimatorSettings
from llmfoundry.train.callbacks.speed_monitor import WallClock
from llmfoundry.train.state import TrainState


class RuntimeEstimator(Callback):
    def __init__(self, settings: RuntimeEstimatorSettings):
        self.settings = settings
        self.divider = SECONDS_PER_UNIT[settings.time_unit]
        self._reset()

    def _reset(self) -> None:
        self.to_skip = self.settings.skip_batches
        self.start_time: float | None = None
        self.start_fraction = 0.0
        self.clock = WallClock()
        self.eval_seconds: list[float] = []  # each evaluation since the clock started
        self.fraction_per_eval = 0.0  # of max_duration, between evaluations

    def on_fit_start(self, state: TrainState):
        self._reset()
        for logger in state.loggers:  # rank 0's loggers (other ranks have none)
            logger.log_hyperparameters({"time/remaining_estimate_unit": self.settings.time_unit})

    @staticmethod
    def _fraction(state: TrainState) -> float:
        """How much of max_duration is done (the trainer counts every unit of max_duration in batches)."""
        return state.time.batch / max(1, state.max_batches)

    def on_batch_start(self, state: TrainState):
        if self.start_time is None and self.to_skip == 0:
            self.start_time = time.perf_counter()
            self.start_fraction = self._fraction(state)
            self.clock = WallClock()

    def on_batch_end(self, state: TrainState, metrics):
        self.clock.batch_end()
        if self.to_skip > 0:
            self.to_skip -= 1
            return
        fraction = self._fraction(state)
        if self.start_time is None or fraction <= self.start_fraction:
            return
        elapsed = time.perf_counter() - self.start_time - sum(self.eval_seconds)
        remaining = elapsed / (fraction - self.start_fraction) * (1 - fraction)
        if self.eval_seconds:
            done = len(self.eval_seconds)
            average = sum(self.eval_seconds[1:]) / (done - 1) if done > 1 else self.eval_seconds[0]
            expected = (1 - self.start_fraction) / self.fraction_per_eval if self.fraction_per_eval > 0 else done
            remaining += average * (expected - done)
        metrics["time/remaining_estimate"] = remaining / self.divider

    def on_eval_start(self, state: TrainState):
        self.clock.eval_started()

    def on_eval_end(self, state: TrainState, metrics):
        seconds = self.clock.eval_ended()
        if self.start_time is None:  # evaluations before the clock started (eval_first) do not count
            return
        self.eval_seconds.append(seconds)
        self.fraction_per_eval = (self._fraction(state) - self.start_fraction) / len(self.eval_seconds)


def build_runtime_estimator(settings: RuntimeEstimatorSettings) -> Callback:
    return RuntimeEstimator(settings)
