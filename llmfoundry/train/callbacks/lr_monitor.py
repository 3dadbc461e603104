"""lr_monitor: logs the learning rate of every optimizer parameter group."""

from __future__ import annotations

from dataclasses import dataclass

from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback


@dataclass
class LRMonitorSettings:
    pass


class LRMonitor(Callback):
    def on_batch_end(self, trainer, metrics):
        name = type(trainer.optimizer).__name__
        for i, group in enumerate(trainer.optimizer.param_groups):
            metrics[f"lr-{name}/group{i}"] = float(group["lr"])


@callbacks.register("lr_monitor", config=LRMonitorSettings)
def build_lr_monitor(settings: LRMonitorSettings) -> Callback:
    return LRMonitor()
