"""early_stopper (Composer's EarlyStopper): stop training when a metric has not improved for ``patience``.

The metric is ``metrics/{dataloader_label}/{monitor}`` as this trainer logs it: ``dataloader_label: eval`` with
``monitor: LanguageCrossEntropy`` reads ``metrics/eval/LanguageCrossEntropy`` after each evaluation; an
``eval_loaders`` entry's label ``eval/<label>`` reads ``metrics/eval/<label>/...``. ``dataloader_label: train``
reads ``metrics/train/<monitor>`` after each batch (the model's train metrics; with use_train_metrics: false,
LanguageCrossEntropy and LanguagePerplexity still come from the training loss). The run then ends as at
max_duration: a final evaluation and, with save_folder, a checkpoint.
"""

from __future__ import annotations

import math

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import EarlyStopperSettings, parse_patience
from llmfoundry.train.state import TrainState

KEY = "callbacks.early_stopper"
# without the model's train metrics (use_train_metrics: false), these come from the training loss
TRAIN_METRICS = {"LanguageCrossEntropy": lambda loss: loss, "LanguagePerplexity": lambda loss: math.exp(min(loss, 700))}
LOWER_IS_BETTER = ("loss", "error", "perplexity")  # Composer's rule for the default comparison


class EarlyStopper(Callback):
    def __init__(self, settings: EarlyStopperSettings):
        self.s = settings
        self.patience = parse_patience(settings.patience)
        comp = (settings.comp or "").lower()
        if comp:
            self.lower_is_better = comp in ("lt", "less")
        else:
            self.lower_is_better = any(word in settings.monitor.lower() for word in LOWER_IS_BETTER)
        self.best: float | None = None
        self.best_at: tuple[int, int] = (0, 0)  # (batch, epoch) of the best value

    def on_batch_end(self, state: TrainState, metrics):
        if self.s.dataloader_label != "train":
            return
        name = f"metrics/train/{self.s.monitor}"
        if name in metrics:
            self._update(state, float(metrics[name]))
        elif self.s.monitor in TRAIN_METRICS:
            self._update(state, TRAIN_METRICS[self.s.monitor](float(metrics["loss/train/total"])))  # a device sync
        else:
            shown = ", ".join(sorted(k for k in metrics if k.startswith("metrics/train/"))) or "none"
            raise ConfigError(f"{KEY}.monitor: no train metric '{name}' (logged: {shown}); monitor one of them or "
                              "add it to model.additional_train_metrics")

    def on_eval_end(self, state: TrainState, metrics):
        if self.s.dataloader_label == "train":
            return
        label = self.s.dataloader_label
        names = (f"metrics/{label}/{self.s.monitor}", f"{label}/{self.s.monitor}")
        found = [metrics[name] for name in names if name in metrics]
        if not found:
            shown = ", ".join(sorted(metrics)[:8]) or "none"
            raise ConfigError(f"{KEY}: no metric '{names[0]}' after evaluation (logged: {shown}); set monitor and "
                              "dataloader_label to one of them")
        self._update(state, float(found[0]))

    def _update(self, state: TrainState, value: float) -> None:
        now = (state.time.batch, state.time.epoch)
        if self.best is None:
            self.best, self.best_at = value, now
        else:
            better = value < self.best if self.lower_is_better else value > self.best
            if better and abs(value - self.best) > abs(self.s.min_delta):
                self.best, self.best_at = value, now
        index = 0 if self.patience.unit == "ba" else 1
        if now[index] - self.best_at[index] > self.patience.value:
            state.request_stop(f"early_stopper: {self.s.monitor} has not improved on {self.best:.6g} for "
                               f"{now[index] - self.best_at[index]}{self.patience.unit}")


def build_early_stopper(settings: EarlyStopperSettings) -> Callback:
    return EarlyStopper(settings)
