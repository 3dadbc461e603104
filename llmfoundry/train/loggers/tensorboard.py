"""tensorboard logger: scalars per step and the (secret-masked) config as text."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from llmfoundry.config.fields import option
from llmfoundry.registry import loggers
from llmfoundry.train.loggers.base import Logger


@dataclass
class TensorboardSettings:
    log_dir: str | None = option(None, "event file folder (default: runs/<run_name>)")
    flush_interval: int = option(10, "flush events every this many logging steps")


class TensorboardLogger(Logger):
    def __init__(self, settings: TensorboardSettings, run_name: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=settings.log_dir or f"runs/{run_name}")
        self.flush_interval = max(1, settings.flush_interval)
        self.calls = 0

    def log_hyperparameters(self, config):
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log_metrics(self, metrics, step):
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.calls += 1
        if self.calls % self.flush_interval == 0:
            self.writer.flush()

    def close(self):
        self.writer.close()


@loggers.register("tensorboard", config=TensorboardSettings)
def build_tensorboard(settings: TensorboardSettings, run_name: str) -> Logger:
    return TensorboardLogger(settings, run_name)
