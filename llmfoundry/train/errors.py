"""How a training run stops on purpose: raised by the trainer or a callback, caught by `llmfoundry train`.

A module of its own so that callbacks (loss_spike_guard) can raise it without importing the trainer that runs them.
"""

from __future__ import annotations


class TrainingStopped(RuntimeError):
    """Raised (by the trainer or a callback such as loss_spike_guard) to stop training with a clear message."""
