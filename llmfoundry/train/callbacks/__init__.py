"""Callbacks by name. Importing this package registers the built-in ones."""

from llmfoundry.train.callbacks import lr_monitor  # noqa: F401
from llmfoundry.train.callbacks.base import Callback

__all__ = ["Callback"]
