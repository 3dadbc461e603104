"""mlflow logger: Composer's MLFlowLogger on a local file store or an MLflow tracking server (mlflow-skinny).

Params are the secret-masked config, flattened ({"model": {"n_layers": 2}} -> model.n_layers; Composer logs each
top-level key as one string), plus mlflow_experiment_id and mlflow_run_id. A run ends FINISHED when the logger is
closed normally, FAILED when it is closed while an exception propagates or never closed before the process exits.
A table a callback logs goes to the artifact ``<name>.json`` with MLflow's log_table (as Composer does: the rows of
later steps are appended to the same file; the step is not recorded); MLflow needs pandas for that.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.secrets import mask_secrets
from llmfoundry.train.loggers.base import Logger, matches_any
from llmfoundry.train.loggers.settings import DEFAULT_EXPERIMENT, MLflowSettings, databricks_problem

MAX_PARAM_LENGTH = 6000  # MLflow refuses longer param values
# Composer samples system metrics every 5 s and logs every 6 samples; these environment variables may say otherwise
COMPOSER_SYSTEM_METRICS = (("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", 5),
                           ("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", 6))


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"} (lists are kept as one value)."""
    if not isinstance(config, dict):
        return {prefix: str(config)[:MAX_PARAM_LENGTH]}
    flat: dict[str, str] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def metric_name(key: str) -> str:
    """MLflow accepts letters, digits and '_-. /' in metric names."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


def ignored_param(key: str, patterns: list[str]) -> bool:
    """Whether a flattened key, or a section that holds it (model for model.n_layers), matches a pattern."""
    parts = key.split(".")
    return any(matches_any(".".join(parts[:i]), patterns) for i in range(1, len(parts) + 1))


def tracking_uri(settings: MLflowSettings) -> str:
    uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None:
        if os.environ.get("DATABRICKS_TOKEN"):
            notice_once("loggers.mlflow: DATABRICKS_TOKEN is set but runs go to file:./mlruns (Composer would log "
                        "to Databricks, which is not supported here); set tracking_uri to say where")
        uri = f"file:{os.path.abspath('mlruns')}"
    problem = databricks_problem("loggers.mlflow.tracking_uri (from MLFLOW_TRACKING_URI)", uri)
    if problem:
        raise ConfigError(problem)
    return uri


class MLflowLogger(Logger):
    def __init__(self, settings: MLflowSettings, run_name: str):
        import mlflow

        self.mlflow = mlflow
        self.settings = settings
        self.uri = tracking_uri(settings)
        if self.uri.startswith("file:") or "://" not in self.uri:
            # MLflow 3 refuses its file store unless asked; a local folder is what this logger promises.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if settings.logging_buffer_seconds:
            os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = str(settings.logging_buffer_seconds)
        if settings.log_system_metrics:
            for variable, composer_value in COMPOSER_SYSTEM_METRICS:
                os.environ.setdefault(variable, str(composer_value))
        mlflow.set_tracking_uri(self.uri)
        if settings.model_registry_uri:
            mlflow.set_registry_uri(settings.model_registry_uri)
        self.client = mlflow.MlflowClient(self.uri)
        self.run_name = settings.run_name or run_name
        self.experiment_id = self._experiment_id()
        self.run_id = self._run_id(run_name)
        tags = {str(k): str(v) for k, v in mask_secrets(dict(settings.tags or {})).items()}
        tags["run_name"] = run_name  # how resume finds this run again
        if settings.run_group:
            tags["run_group"] = settings.run_group
        mlflow.start_run(run_id=self.run_id, tags=tags, log_system_metrics=settings.log_system_metrics)
        self.closed = False
        atexit.register(self._end_unclosed)
        self.last_logged: dict[str, tuple[float, int]] = {}  # metric -> (value, step) last sent
        self.log_hyperparameters({"mlflow_experiment_id": self.experiment_id, "mlflow_run_id": self.run_id})

    def _experiment_id(self) -> str:
        from_env = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if from_env:
            return from_env
        name = self.settings.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        return experiment.experiment_id if experiment is not None else self.client.create_experiment(name)

    def _run_id(self, run_name: str) -> str:
        from_env = os.environ.get("MLFLOW_RUN_ID")
        if from_env:
            return from_env
        if self.settings.resume:
            runs = self.client.search_runs([self.experiment_id], filter_string=f'tags.run_name = "{run_name}"',
                                           max_results=1)
            if runs:
                return runs[0].info.run_id
        return self.client.create_run(self.experiment_id, run_name=self.run_name).info.run_id

    def log_hyperparameters(self, config):
        patterns = self.settings.ignore_hyperparameters or []
        params = {k: v for k, v in flatten(mask_secrets(config)).items() if not ignored_param(k, patterns)}
        logged = self.client.get_run(self.run_id).data.params  # a resumed run keeps its first values
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
        if changed:
            notice_once(f"loggers.mlflow: params {', '.join(changed[:5])} differ from the resumed run's and keep "
                        "their first values (MLflow params cannot change)")
        items = [(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            self.mlflow.log_params(dict(items[i:i + 100]), synchronous=self.settings.synchronous, run_id=self.run_id)

    def log_metrics(self, metrics, step):
        settings = self.settings
        renames = settings.rename_metrics or {}
        batch = {}
        for key, value in metrics.items():
            if matches_any(key, settings.ignore_metrics or []):
                continue
            value = float(value)
            last = self.last_logged.get(key)
            # an unchanged value is sent again only every log_duplicated_metric_every_n_steps steps (Composer's rule)
            if last is not None and last[0] == value and step < last[1] + settings.log_duplicated_metric_every_n_steps:
                continue
            self.last_logged[key] = (value, step)
            batch[metric_name(renames.get(key, key))] = value
        if batch:
            self.mlflow.log_metrics(batch, step=step, synchronous=settings.synchronous, run_id=self.run_id)

    def log_table(self, columns, rows, name, step):
        data = {column: [row[i] for row in rows] for i, column in enumerate(columns)}
        try:
            self.client.log_table(self.run_id, data=data, artifact_file=f"{name}.json")
        except ModuleNotFoundError as error:
            if error.name != "pandas":
                raise
            notice_once("loggers.mlflow: MLflow needs pandas to log tables (pip install pandas); the callbacks' "
                        "tables are not logged to MLflow")

    def register_model(self, model_uri: str, name: str, await_registration_for: int = 300,
                       tags: dict[str, Any] | None = None):
        """Register ``model_uri`` as '<model_registry_prefix>.<name>' (or ``name``) in the model registry."""
        prefix = self.settings.model_registry_prefix
        return self.mlflow.register_model(model_uri=model_uri, name=f"{prefix}.{name}" if prefix else name,
                                          await_registration_for=await_registration_for, tags=tags)

    def close(self):
        failed = sys.exc_info()[0] is not None  # closed from a finally block while an error propagates
        self._end("FAILED" if failed else "FINISHED")

    def _end_unclosed(self) -> None:
        if not self.closed:  # at exit, where asynchronous logging can no longer be flushed
            self._end("FAILED", flush=False)

    def _end(self, status: str, flush: bool = True) -> None:
        self.closed = True
        atexit.unregister(self._end_unclosed)
        if flush:
            self.mlflow.flush_async_logging()
        active = self.mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            self.mlflow.end_run(status=status)
        else:
            self.client.set_terminated(self.run_id, status=status)


def build_mlflow(settings: MLflowSettings, run_name: str) -> Logger:
    return MLflowLogger(settings, run_name)
