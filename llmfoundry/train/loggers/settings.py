"""The config sections of the built-in loggers, checked before anything runs.

Kept apart from the loggers themselves (and from wandb, mlflow or tensorboard, imported when a run builds one), so
that checking a recipe loads none of them. What needs Databricks (its tracking server, Unity Catalog's model
registry) is a one-line error: the mlflow logger writes to a local file store or to an MLflow tracking server, with
the ``mlflow-skinny`` package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option


@dataclass
class JsonlSettings:
    path: str = option("metrics.jsonl", "file to append metrics to")


@dataclass
class InMemorySettings:
    """Composer's InMemoryLogger takes no settings."""


@dataclass
class WandbSettings:
    project: str | None = option(None, "wandb project")
    group: str | None = option(None, "run group")
    name: str | None = option(None, "run name (default: the recipe's run_name)")
    entity: str | None = option(None, "wandb entity (user or team)")
    tags: list[str] | None = option(None, "run tags")
    log_artifacts: bool = option(False, "log each saved checkpoint as a wandb artifact")
    rank_zero_only: bool = option(True, "log from rank 0 only",
                                  unsupported="logging from every rank (loggers run on rank 0 only here)")
    init_kwargs: dict[str, Any] = option(default_factory=dict, doc="more keyword arguments for wandb.init")
    mode: str | None = option(None, "online, offline or disabled (default: WANDB_MODE or online; not a Composer "
                                    "key, same as init_kwargs.mode)")
    dir: str | None = option(None, "local folder for wandb files (not a Composer key, same as init_kwargs.dir)")


@dataclass
class TensorboardSettings:
    log_dir: str | None = option(None, "folder of the run folders: events go to <log_dir>/<run_name> (default: "
                                       "tensorboard_logs)")
    flush_interval: int = option(100, "write events to disk on batches that are multiples of this")
    rank_zero_only: bool = option(True, "log from rank 0 only",
                                  unsupported="logging from every rank (loggers run on rank 0 only here)")

    def check_settings(self, path: str) -> list[str]:
        if self.flush_interval < 1:
            return [f"{path}.flush_interval: must be at least 1, got {self.flush_interval}"]
        return []


# -- mlflow ----------------------------------------------------------------------------------------------------------

DEFAULT_EXPERIMENT = "my-mlflow-experiment"  # Composer's, when neither the key nor MLFLOW_EXPERIMENT_NAME is set


def databricks_problem(key: str, uri: str) -> str | None:
    """The one-line error for a Databricks URI in ``key``, or None."""
    if not uri.split(":", 1)[0].startswith("databricks"):
        return None
    return (f"{key}: '{uri}' needs Databricks (workspace credentials, databricks-sdk), which this logger does not "
            "support; use a file: folder or an MLflow server URL (http://host:5000)")


@dataclass
class MLflowSettings:
    experiment_name: str | None = option(None, f"experiment (default: MLFLOW_EXPERIMENT_NAME, else "
                                               f"'{DEFAULT_EXPERIMENT}'); MLFLOW_EXPERIMENT_ID picks one by id")
    run_name: str | None = option(None, "run name (default: the recipe's run_name)")
    tags: dict[str, Any] | None = option(None, "run tags (secret-looking values masked); the logger adds run_name "
                                               "and, with run_group, run_group")
    tracking_uri: str | None = option(None, "MLflow tracking URI: a file: folder or an MLflow server URL "
                                            "(default: MLFLOW_TRACKING_URI, else file:./mlruns)",
                                      differs="without it and MLFLOW_TRACKING_URI, runs go to file:./mlruns "
                                              "(Composer: MLflow's default, or Databricks when DATABRICKS_TOKEN "
                                              "is set)")
    rank_zero_only: bool = option(True, "log from rank 0 only",
                                  unsupported="logging from every rank (loggers run on rank 0 only here)")
    flush_interval: int = option(10, "accepted for Composer's recipes; Composer does not use it either "
                                     "(logging_buffer_seconds sets the batching)")
    model_registry_prefix: str = option("", "prefix of registered model names: '<prefix>.<name>'")
    model_registry_uri: str | None = option(None, "model registry URI (default: the tracking URI); Unity "
                                                  "Catalog (databricks-uc) is not supported")
    synchronous: bool = option(False, "log each call before returning; false queues calls (MLflow's async "
                                      "logging), flushed when the run ends")
    log_system_metrics: bool = option(True, "also log MLflow's system/... metrics (CPU, memory, disk, network; "
                                            "GPUs with pynvml): a sample every 5 s, logged every 6 samples "
                                            "unless MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL / "
                                            "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING say otherwise")
    rename_metrics: dict[str, str] | None = option(None, "log a metric under another name: {name: new name} "
                                                         "(exact names)")
    ignore_metrics: list[str] | None = option(None, "glob patterns of metrics not to log")
    ignore_hyperparameters: list[str] | None = option(None, "glob patterns of hyperparameters not to log; a "
                                                            "pattern that matches a section (model) leaves out "
                                                            "its keys (model.n_layers, ...)")
    run_group: str | None = option(None, "tag run_group, to group runs")
    resume: bool = option(False, "continue the experiment's run tagged with this run_name, if there is one "
                                 "(MLFLOW_RUN_ID picks a run by id)")
    logging_buffer_seconds: int | None = option(10, "seconds that asynchronous logging gathers calls before "
                                                    "sending them (MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS)")
    log_duplicated_metric_every_n_steps: int = option(100, "a metric whose value has not changed is logged again "
                                                           "only after this many steps")

    def check_settings(self, path: str) -> list[str]:
        problems = []
        for key in ("tracking_uri", "model_registry_uri"):
            problem = databricks_problem(f"{path}.{key}", getattr(self, key) or "")
            if problem:
                problems.append(problem)
        if self.log_duplicated_metric_every_n_steps < 0:
            problems.append(f"{path}.log_duplicated_metric_every_n_steps: must be >= 0 (0 logs every value), got "
                            f"{self.log_duplicated_metric_every_n_steps}")
        if self.logging_buffer_seconds is not None and self.logging_buffer_seconds < 0:
            problems.append(f"{path}.logging_buffer_seconds: must be >= 0, got {self.logging_buffer_seconds}")
        return problems


@dataclass
class MosaicMLSettings:
    log_interval: Any = option(None, "Composer's key (refused with the logger)")
    ignore_keys: Any = option(None, "Composer's key (refused with the logger)")
    ignore_exceptions: Any = option(None, "Composer's key (refused with the logger)")

    def check_settings(self, path: str) -> list[str]:
        return [f"{path}: not available here: it reports to the MosaicML platform (mcli), which runs here do not "
                "use; log with wandb, mlflow, tensorboard or jsonl instead"]
