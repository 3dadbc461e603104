"""Loggers by name. Importing this package registers the built-in ones."""

from llmfoundry.train.loggers import jsonl, wandb  # noqa: F401
from llmfoundry.train.loggers.base import Logger

__all__ = ["Logger"]
