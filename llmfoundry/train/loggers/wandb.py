"""wandb logger (set WANDB_MODE=offline to log without a network)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option
from llmfoundry.registry import loggers
from llmfoundry.train.loggers.base import Logger


@dataclass
class WandbSettings:
    project: str | None = option(None, "wandb project")
    entity: str | None = option(None, "wandb entity (user or team)")
    name: str | None = option(None, "run name (default: the recipe's run_name)")
    group: str | None = option(None, "run group")
    tags: list[str] = option(default_factory=list, doc="run tags")
    mode: str | None = option(None, "online, offline or disabled (default: WANDB_MODE or online)")
    dir: str | None = option(None, "local folder for wandb files")
    init_kwargs: dict[str, Any] = option(default_factory=dict, doc="more keyword arguments for wandb.init")


class WandbLogger(Logger):
    def __init__(self, settings: WandbSettings, run_name: str):
        import wandb

        kwargs = dict(settings.init_kwargs)
        kwargs.setdefault("project", settings.project)
        kwargs.setdefault("entity", settings.entity)
        kwargs.setdefault("name", settings.name or run_name)
        kwargs.setdefault("group", settings.group)
        kwargs.setdefault("tags", settings.tags or None)
        if settings.mode:
            kwargs.setdefault("mode", settings.mode)
        if settings.dir:
            kwargs.setdefault("dir", settings.dir)
        self.run = wandb.init(**kwargs)

    def log_hyperparameters(self, config):
        self.run.config.update(config, allow_val_change=True)

    def log_metrics(self, metrics, step):
        self.run.log(metrics, step=step)

    def close(self):
        self.run.finish()


@loggers.register("wandb", config=WandbSettings)
def build_wandb(settings: WandbSettings, run_name: str) -> Logger:
    return WandbLogger(settings, run_name)
