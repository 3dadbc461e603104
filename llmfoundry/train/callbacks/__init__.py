"""Callbacks by name. Importing this package registers the built-in ones."""

from llmfoundry.train.callbacks import (  # noqa: F401
    hf_checkpointer,
    loss_spike_guard,
    lr_monitor,
    memory_monitor,
    runtime_estimator,
    speed_monitor,
)
from llmfoundry.train.callbacks.base import Callback

__all__ = ["Callback"]
