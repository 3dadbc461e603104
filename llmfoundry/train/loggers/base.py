"""The interface of a metrics logger. Only rank 0 builds loggers."""

from __future__ import annotations

from typing import Any


class Logger:
    def log_hyperparameters(self, config: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...
