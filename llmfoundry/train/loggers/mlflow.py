"""mlflow logger: params (the secret-masked config, flattened) and metrics of one run.

``tracking_uri`` defaults to MLFLOW_TRACKING_URI, else a local file store in ./mlruns; a Databricks or server URI
works the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option
from llmfoundry.registry import loggers
from llmfoundry.train.loggers.base import Logger


@dataclass
class MLflowSettings:
    tracking_uri: str | None = option(None, "MLflow tracking URI (default: MLFLOW_TRACKING_URI or file:./mlruns)")
    experiment_name: str | None = option(None, "experiment (default: llmfoundry)")
    run_name: str | None = option(None, "run name (default: the recipe's run_name)")
    tags: dict[str, str] = option(default_factory=dict, doc="run tags")


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"} (lists are kept as one value)."""
    if not isinstance(config, dict):
        return {prefix: str(config)[:6000]}
    flat: dict[str, str] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _metric_name(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


class MLflowLogger(Logger):
    def __init__(self, settings: MLflowSettings, run_name: str):
        import mlflow

        self.mlflow = mlflow
        uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{os.path.abspath('mlruns')}"
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses its file store unless asked; a local folder is what this logger promises.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(settings.experiment_name or "llmfoundry")
        self.run = mlflow.start_run(run_name=settings.run_name or run_name, tags=settings.tags or None)

    def log_hyperparameters(self, config):
        params = flatten(config)
        items = list(params.items())
        for i in range(0, len(items), 100):  # mlflow takes at most 100 params per call
            self.mlflow.log_params(dict(items[i:i + 100]))

    def log_metrics(self, metrics, step):
        self.mlflow.log_metrics({_metric_name(k): float(v) for k, v in metrics.items()}, step=step)

    def close(self):
        self.mlflow.end_run()


@loggers.register("mlflow", config=MLflowSettings)
def build_mlflow(settings: MLflowSettings, run_name: str) -> Logger:
    return MLflowLogger(settings, run_name)
