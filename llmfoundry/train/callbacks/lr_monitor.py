"""lr_monitor: logs the learning rate of every optimizer parameter group."""

from __future__ import annotations

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import LRMonitorSettings
from llmfoundry.train.state import TrainState


class LRMonitor(Callback):
    def on_batch_end(self, state: TrainState, metrics):
        name = type(state.optimizer).__name__
        for i, group in enumerate(state.optimizer.param_groups):
            metrics[f"lr-{name}/group{i}"] = float(group["lr"])


def build_lr_monitor(settings: LRMonitorSettings) -> Callback:
    return LRMonitor()
