"""loss_spike_guard: stop, skip the optimizer step, or checkpoint and stop when the training loss is NaN/inf or spikes.

A spike is a loss above ``spike_factor`` x the mean of the last ``window`` accepted losses (after ``min_history``
batches). The loss is the global one (all ranks agree), so every rank takes the same decision. With
``action: skip`` the batch's gradients are dropped; after ``max_consecutive_skips`` skipped batches in a row the
run stops anyway, since the model is not recovering. ``action: checkpoint`` drops the batch's update too, then
saves a checkpoint and stops with an error: a person looks at it, and resuming continues after the bad batch, exactly
as ``skip`` would have gone on.
"""

from __future__ import annotations

import math
from collections import deque

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import LossSpikeGuardSettings
from llmfoundry.train.errors import TrainingStopped
from llmfoundry.train.state import TrainState


class LossSpikeGuard(Callback):
    def __init__(self, settings: LossSpikeGuardSettings):
        self.s = settings
        self.history: deque[float] = deque(maxlen=max(1, settings.window))
        self.skips_in_a_row = 0
        self.skipped = 0
        self.stop_after_batch: str | None = None  # action: checkpoint; what went wrong

    def _problem(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return f"the training loss is {loss}" if self.s.check_nan else None
        if self.s.spike_factor is not None and len(self.history) >= self.s.min_history:
            mean = sum(self.history) / len(self.history)
            if loss > self.s.spike_factor * mean:
                return (f"the training loss spiked to {loss:.4g}, more than {self.s.spike_factor:g}x the mean "
                        f"{mean:.4g} of the last {len(self.history)} batches")
        return None

    def should_skip_step(self, state: TrainState, loss):
        problem = self._problem(loss)
        if problem is None:
            self.history.append(loss)
            self.skips_in_a_row = 0
            return False
        where = f"at batch {state.time.batch + 1}"
        if self.s.action == "stop":
            raise TrainingStopped(f"loss_spike_guard: {problem} {where} (lower the learning rate, add "
                                  "gradient_clipping, resume from an earlier checkpoint, or set "
                                  "callbacks.loss_spike_guard.action: skip)")
        self.skips_in_a_row += 1
        self.skipped += 1
        if self.s.action == "checkpoint":
            self.stop_after_batch = f"{problem} {where}"
            return True
        if self.skips_in_a_row > self.s.max_consecutive_skips:
            raise TrainingStopped(f"loss_spike_guard: {problem} {where}, {self.skips_in_a_row} batches in a row "
                                  "(the run is not recovering; resume from an earlier checkpoint)")
        state.print(f"loss_spike_guard: {problem} {where}; skipping this batch")
        return True

    def on_batch_end(self, state: TrainState, metrics):
        metrics["train/skipped_batches"] = float(self.skipped)
        if self.stop_after_batch is not None:
            self._checkpoint_and_stop(state)

    def _checkpoint_and_stop(self, state: TrainState) -> None:
        """After the skipped batch has been counted: save (and wait for the upload), then stop."""
        if not state.save_folder:
            raise TrainingStopped(f"loss_spike_guard: {self.stop_after_batch}; no save_folder, so nothing was saved")
        path = state.save()
        if not state.finish_uploads():
            raise TrainingStopped(f"loss_spike_guard: {self.stop_after_batch}; the checkpoint {path} could not be "
                                  "uploaded")
        raise TrainingStopped(f"loss_spike_guard: {self.stop_after_batch}; saved {path} without that batch's update "
                              "(resume from it, e.g. with a lower learning rate, to go on after the batch)")


def build_loss_spike_guard(settings: LossSpikeGuardSettings) -> Callback:
    return LossSpikeGuard(settings)
