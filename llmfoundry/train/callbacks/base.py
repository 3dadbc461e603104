"""The hooks a callback may implement; the trainer calls them on every rank in this order."""

from __future__ import annotations

from typing import Any

import torch

from llmfoundry.train.state import TrainState


class Callback:
    """Override the events you need. ``metrics`` dicts may be extended in place: what a callback adds is logged.

    A training batch's metrics are not read from the device until a log interval (train/step_metrics.py): their
    values are floats, 0-d device tensors or ``Derived`` values. ``float(value)`` (or comparing, computing with
    it) reads one at once, which waits for the GPU: do it only when the callback is enabled and needs the number.

    A callback whose state must survive a resume names it in ``state_name`` and implements ``state_dict()`` /
    ``load_state_dict(state)`` (tensors and plain types): checkpoints then hold it as a component of their own
    (train.components), the same on every rank (rank 0's is restored)."""

    #: the callback's key in checkpoints (and in save/load_ignore_keys, as ``state/callbacks/<state_name>``)
    state_name: str | None = None

    def on_fit_start(self, state: TrainState) -> None: ...

    def on_batch_start(self, state: TrainState) -> None: ...

    def on_after_backward(self, state: TrainState, microbatch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """After each microbatch's backward pass (Composer's after_backward), with its inputs and output logits."""

    def should_skip_step(self, state: TrainState, loss: float) -> bool:
        """Called after backward with the batch's global loss; True = skip this optimizer step."""
        return False

    def on_optimizer_step(self, state: TrainState, metrics: dict[str, Any]) -> None:
        """After the optimizer step, while the (clipped, unscaled) gradients are still there; not on skipped steps."""

    def host_numbers(self, state: TrainState) -> dict[str, float]:
        """Numbers this rank knows on the host (no device read) that the callback needs summed over every rank for
        this batch, keyed by names of its own: the trainer sums them with its token count in one host collective
        after the optimizer step, and ``on_batch_end`` finds the sums in ``state.host_sums``. Every rank must give
        the same keys."""
        return {}

    def on_batch_end(self, state: TrainState, metrics: dict[str, Any]) -> None: ...

    def on_eval_start(self, state: TrainState) -> None: ...

    def on_eval_end(self, state: TrainState, metrics: dict[str, float]) -> None: ...

    def on_checkpoint_saved(self, state: TrainState, path: str) -> None: ...

    def on_fit_end(self, state: TrainState) -> None: ...

