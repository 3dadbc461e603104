"""fdiff_metrics (llm-foundry's FDiffMetrics): the change of each metric since its previous value, logged as
``<metric>_fdiff``: the training loss and train metrics after each batch (``diff_train_metrics``), the evaluation
metrics after each evaluation (``diff_eval_metrics``)."""

from __future__ import annotations

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import FDiffSettings
from llmfoundry.train.state import TrainState


class FDiffMetrics(Callback):
    def __init__(self, settings: FDiffSettings):
        self.s = settings
        self.previous_train: dict[str, float] = {}
        self.previous_eval: dict[str, float] = {}

    def on_batch_end(self, state: TrainState, metrics):
        if self.s.diff_train_metrics:
            names = ["loss/train/total"] + [k for k in metrics if k.startswith("metrics/train/")]
            _diff(metrics, names, self.previous_train)

    def on_eval_end(self, state: TrainState, metrics):
        if self.s.diff_eval_metrics:
            _diff(metrics, [k for k in metrics if not k.endswith("_fdiff")], self.previous_eval)


def _diff(metrics: dict[str, float], names: list[str], previous: dict[str, float]) -> None:
    for name in names:
        value = float(metrics[name])
        if name in previous:
            metrics[f"{name}_fdiff"] = value - previous[name]
        previous[name] = value


def build_fdiff_metrics(settings: FDiffSettings) -> Callback:
    return FDiffMetrics(settings)
