"""wandb logger: Composer's WandBLogger keys (set WANDB_MODE=offline, or mode: offline, to log without a network).

``project``, ``group``, ``name``, ``entity`` and ``tags`` go to ``wandb.init`` and win over the same keys in
``init_kwargs``; the run is named after the recipe's run_name unless one of them names it. With ``log_artifacts``
each checkpoint the trainer saves becomes an artifact named after its folder (type ``checkpoint``, aliases
``latest`` and ``ep{epoch}-ba{batch}``): a local folder is added with its files, an s3:// checkpoint as a reference
(not checksummed: the upload may still be running when the trainer reports it). A table a callback logs becomes a
``wandb.Table`` logged under its name at its step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from llmfoundry.core.secrets import mask_secrets
from llmfoundry.train.loggers.base import Logger
from llmfoundry.train.loggers.settings import WandbSettings


def init_arguments(settings: WandbSettings, run_name: str) -> dict[str, Any]:
    """wandb.init's keyword arguments: init_kwargs, overridden by the named keys that are set (as Composer does)."""
    kwargs = dict(settings.init_kwargs)
    named = {"project": settings.project, "group": settings.group, "name": settings.name,
             "entity": settings.entity, "tags": settings.tags, "mode": settings.mode, "dir": settings.dir}
    kwargs.update({key: value for key, value in named.items() if value is not None})
    if kwargs.get("name") is None:
        kwargs["name"] = run_name
    if "config" in kwargs:  # what wandb stores as the run's config: never with a token in it
        kwargs["config"] = mask_secrets(kwargs["config"])
    return kwargs


def artifact_name(path: str) -> str:
    """wandb accepts letters, digits, '-', '_' and '.' in artifact names (Composer replaces the rest with '.')."""
    return re.sub(r"[^a-zA-Z0-9\-_.]", ".", path.rstrip("/").rsplit("/", 1)[-1])


class WandbLogger(Logger):
    def __init__(self, settings: WandbSettings, run_name: str):
        import wandb

        self.wandb = wandb
        self.log_artifacts = settings.log_artifacts
        self.run = wandb.init(**init_arguments(settings, run_name))

    def log_hyperparameters(self, config):
        self.run.config.update(mask_secrets(config), allow_val_change=True)

    def log_metrics(self, metrics, step):
        self.run.log(dict(metrics), step=step)  # wandb.log changes the dict it is given

    def log_table(self, columns, rows, name, step):
        # a column may hold values of several types (an eval output's token ids: a list, or a list of lists)
        table = self.wandb.Table(columns=list(columns), rows=[list(row) for row in rows], allow_mixed_types=True)
        self.run.log({name: table}, step=step)

    def log_checkpoint(self, path, epoch, batch):
        if not self.log_artifacts:
            return
        artifact = self.wandb.Artifact(name=artifact_name(path), type="checkpoint",
                                       metadata={"timestamp/epoch": epoch, "timestamp/batch": batch})
        if "://" in path:
            artifact.add_reference(path.rstrip("/") + "/", checksum=False)
        elif Path(path).is_dir():
            artifact.add_dir(path)
        else:
            artifact.add_file(path)
        self.run.log_artifact(artifact, aliases=["latest", f"ep{epoch}-ba{batch}"])

    def close(self):
        self.run.finish()


def build_wandb(settings: WandbSettings, run_name: str) -> Logger:
    return WandbLogger(settings, run_name)
