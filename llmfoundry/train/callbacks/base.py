"""The hooks a callback may implement; the trainer calls them on every rank in this order."""

from __future__ import annotations

from typing import Any


class Callback:
    """Override the events you need. ``metrics`` dicts may be extended in place: what a callback adds is logged."""

    def on_fit_start(self, trainer: Any) -> None: ...

    def on_batch_start(self, trainer: Any) -> None: ...

    def should_skip_step(self, trainer: Any, loss: float) -> bool:
        """Called after backward with the batch's global loss; True = skip this optimizer step."""
        return False

    def on_batch_end(self, trainer: Any, metrics: dict[str, float]) -> None: ...

    def on_eval_end(self, trainer: Any, metrics: dict[str, float]) -> None: ...

    def on_checkpoint_saved(self, trainer: Any, path: str) -> None: ...

    def on_fit_end(self, trainer: Any) -> None: ...
