"""Loggers by name. Importing this package registers the built-in ones (their libraries load only when used)."""

from llmfoundry.train.loggers import in_memory, jsonl, mlflow, mosaicml, tensorboard, wandb  # noqa: F401
from llmfoundry.train.loggers.base import Logger

__all__ = ["Logger"]
