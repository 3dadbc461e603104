"""jsonl logger: one JSON object per logging step, easy to plot or diff.

A metrics line is ``{"step": ..., <metric>: <value>, ...}``; the config is one ``{"hyperparameters": {...}}`` line and
each table a callback logs is one ``{"table": {"name", "step", "columns", "rows"}}`` line (nested, so that readers
that take every line with a top-level "step" for a metrics line keep working).
"""

from __future__ import annotations

import json
from pathlib import Path

from llmfoundry.core.secrets import mask_secrets
from llmfoundry.train.loggers.base import Logger
from llmfoundry.train.loggers.settings import JsonlSettings


class JsonlLogger(Logger):
    def __init__(self, settings: JsonlSettings):
        self.path = Path(settings.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a")

    def log_hyperparameters(self, config):
        self.file.write(json.dumps({"hyperparameters": mask_secrets(config)}, default=str) + "\n")
        self.file.flush()

    def log_metrics(self, metrics, step):
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def log_table(self, columns, rows, name, step):
        table = {"name": name, "step": step, "columns": list(columns), "rows": [list(row) for row in rows]}
        # cells that JSON has no type for (a tensor, a custom object) are written as their text
        self.file.write(json.dumps({"table": table}, default=str) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


def build_jsonl(settings: JsonlSettings, run_name: str) -> Logger:
    return JsonlLogger(settings)
