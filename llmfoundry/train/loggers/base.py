"""The interface of a metrics logger. Only rank 0 builds loggers.

Each logger masks secrets (llmfoundry.core.secrets) in what it logs as hyperparameters itself, whoever calls it.
"""

from __future__ import annotations

import fnmatch
from typing import Any


class Logger:
    def log_hyperparameters(self, config: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_checkpoint(self, path: str, epoch: int, batch: int) -> None:
        """A checkpoint was saved at ``path`` (a local folder or an s3:// URL) after ``batch`` batches."""

    def close(self) -> None: ...


def matches_any(key: str, patterns: list[str]) -> bool:
    """Whether ``key`` matches one of the glob ``patterns`` (Composer's ignore_metrics / ignore_hyperparameters)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)
