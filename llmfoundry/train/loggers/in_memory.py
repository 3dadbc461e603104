"""inmemory logger (also in_memory_logger): Composer's InMemoryLogger: everything logged, kept in this process.

For callbacks, notebooks and tests: find it in ``trainer.loggers`` (rank 0 only) and read

- ``data``: {metric: [(timestamp, value), ...]} in logging order,
- ``most_recent_values`` / ``most_recent_timestamps``: {metric: last value / its timestamp},
- ``hyperparameters``: the (secret-masked) config and what else was logged as a hyperparameter,
- ``get_timeseries(metric)``: {metric: values, "batch": ..., "epoch": ..., "sample": ..., "token": ...} as arrays,
- ``tables``: {name: the last table logged under that name}, as Composer keeps it: a JSON string
  ``{"columns": [...], "data": [[...], ...]}`` (pandas' orient="split" without the index).

A timestamp is a ``LoggedTime`` (epoch, batch, sample, token): the step a value was logged at and the trainer's
time/... metrics last logged with it (Composer's Timestamp also holds wall-clock durations; this one does not).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmfoundry.core.secrets import mask_secrets
from llmfoundry.train.loggers.base import Logger
from llmfoundry.train.loggers.settings import InMemorySettings


@dataclass(frozen=True)
class LoggedTime:
    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0


class InMemoryLogger(Logger):
    def __init__(self) -> None:
        self.data: dict[str, list[tuple[LoggedTime, Any]]] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_timestamps: dict[str, LoggedTime] = {}
        self.hyperparameters: dict[str, Any] = {}
        self.tables: dict[str, str] = {}
        self.time = LoggedTime()

    def log_hyperparameters(self, config):
        self.hyperparameters.update(mask_secrets(config))  # a masked copy

    def log_metrics(self, metrics, step):
        # a train step's metrics carry the trainer's time (time/epoch, time/sample, ...); eval-only calls do not
        known = {unit: int(metrics[f"time/{unit}"]) for unit in ("epoch", "sample", "token")
                 if f"time/{unit}" in metrics}
        self.time = replace(self.time, batch=step, **known)
        values = copy.deepcopy(metrics)
        for key, value in values.items():
            self.data.setdefault(key, []).append((self.time, value))
            self.most_recent_values[key] = value
            self.most_recent_timestamps[key] = self.time

    def log_table(self, columns, rows, name, step):
        # the JSON Composer keeps (written here without pandas); a cell JSON has no type for becomes its text
        table = {"columns": list(columns), "data": [list(row) for row in rows]}
        self.tables[name] = json.dumps(table, default=str, ensure_ascii=False)

    def get_timeseries(self, metric: str) -> dict[str, np.ndarray]:
        """{metric: its values, and one array per unit of time (epoch, batch, sample, token)} in logging order."""
        if metric not in self.data:
            raise ValueError(f"inmemory logger: no metric '{metric}' was logged (logged: {', '.join(self.data)})")
        points = self.data[metric]
        series = {metric: np.array([float(value) for _, value in points])}
        for unit in ("epoch", "batch", "sample", "token"):
            series[unit] = np.array([getattr(when, unit) for when, _ in points])
        return series


def build_in_memory(settings: InMemorySettings, run_name: str) -> Logger:
    return InMemoryLogger()
