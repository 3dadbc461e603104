"""tensorboard logger: Composer's TensorboardLogger: scalars per step in <log_dir>/<run_name>.

Events are flushed on batches that are multiples of ``flush_interval`` and when the run ends. The secret-masked
config is written as text (tag ``config``; Composer writes none), and at the end the hyperparameters with the last
values of the metrics whose names hold "metric" or "loss" go to the HPARAMS tab as hparams/<metric> (Composer writes
them after each evaluation). A table a callback logs is written as text (a Markdown table, tag = its name, at its
step), which the TEXT tab shows as a table (Composer's TensorboardLogger does not log tables).
"""

from __future__ import annotations

import os
from numbers import Number
from typing import Any

import yaml

from llmfoundry.core.secrets import mask_secrets
from llmfoundry.train.loggers.base import Logger
from llmfoundry.train.loggers.settings import TensorboardSettings


def hparam_value(value: Any) -> Any:
    """A value add_hparams takes: numbers, strings and booleans as they are, anything else as its text."""
    if isinstance(value, (bool, str)) or (isinstance(value, Number) and not isinstance(value, complex)):
        return value
    return str(value)


def markdown_cell(value: Any) -> str:
    """A value as the text of one Markdown table cell: '|' escaped, line breaks as <br>."""
    return str(value).replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(markdown_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(markdown_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


class TensorboardLogger(Logger):
    def __init__(self, settings: TensorboardSettings, run_name: str):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(settings.log_dir or "tensorboard_logs", run_name)
        self.run_name = run_name
        # flushed on our schedule only, as Composer does (a year between timed flushes)
        self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=365 * 24 * 3600)
        self.flush_interval = settings.flush_interval
        self.hyperparameters: dict[str, Any] = {}
        self.last_metrics: dict[str, float] = {}

    def log_hyperparameters(self, config):
        config = mask_secrets(config)
        self.hyperparameters.update({k: hparam_value(v) for k, v in config.items()})
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log_metrics(self, metrics, step):
        for key, value in metrics.items():
            if isinstance(value, str):
                continue
            self.writer.add_scalar(key, value, step)
            self.last_metrics[key] = float(value)
        if step % self.flush_interval == 0:
            self.writer.flush()

    def log_table(self, columns, rows, name, step):
        self.writer.add_text(name, markdown_table(columns, rows), step)

    def close(self):
        scores = {f"hparams/{k}": v for k, v in self.last_metrics.items() if "metric" in k or "loss" in k}
        if self.hyperparameters and scores:
            # the HPARAMS tab: one row per run, written to <log_dir>/<run_name>/<run_name> as add_hparams does
            self.writer.add_hparams(self.hyperparameters, scores, run_name=self.run_name)
        self.writer.close()


def build_tensorboard(settings: TensorboardSettings, run_name: str) -> Logger:
    return TensorboardLogger(settings, run_name)
