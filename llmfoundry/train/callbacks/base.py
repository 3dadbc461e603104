"""The hooks a callback may implement; the trainer calls them on every rank in this order."""

from __future__ import annotations

from typing import Any

import torch


class Callback:
    """Override the events you need. ``metrics`` dicts may be extended in place: what a callback adds is logged.

    A callback whose state must survive a resume names it in ``state_name`` and implements ``state_dict()`` /
    ``load_state_dict(state)`` (tensors and plain types): checkpoints then hold it as a component of their own
    (train.components), the same on every rank (rank 0's is restored)."""

    #: the callback's key in checkpoints (and in save/load_ignore_keys, as ``state/callbacks/<state_name>``)
    state_name: str | None = None

    def on_fit_start(self, trainer: Any) -> None: ...

    def on_batch_start(self, trainer: Any) -> None: ...

    def on_after_backward(self, trainer: Any, microbatch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """After each microbatch's backward pass (Composer's after_backward), with its inputs and output logits."""

    def should_skip_step(self, trainer: Any, loss: float) -> bool:
        """Called after backward with the batch's global loss; True = skip this optimizer step."""
        return False

    def on_optimizer_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        """After the optimizer step, while the (clipped, unscaled) gradients are still there; not on skipped steps."""

    def on_batch_end(self, trainer: Any, metrics: dict[str, float]) -> None: ...

    def on_eval_start(self, trainer: Any) -> None: ...

    def on_eval_end(self, trainer: Any, metrics: dict[str, float]) -> None: ...

    def on_checkpoint_saved(self, trainer: Any, path: str) -> None: ...

    def on_fit_end(self, trainer: Any) -> None: ...


def stop_training(trainer: Any, reason: str) -> None:
    """End training after the current batch, as Composer's ``state.stop_training()`` does: the trainer's last batch
    becomes this one, so the run ends as at max_duration (a final evaluation, a checkpoint when save_folder is set,
    the fit_end hooks). Every rank must call it at the same batch (callbacks decide on global values)."""
    if trainer.max_batches > trainer.time.batch:
        trainer.max_batches = trainer.time.batch
        trainer._print(f"stopping training at batch {trainer.time.batch}: {reason}")
