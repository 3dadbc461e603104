"""Training on a Ray cluster with Ray Train (V2): ``fit(recipe, ...)`` and `llmfoundry ray`.

The recipe is loaded and validated once, here on the driver (bad input fails before Ray starts), resolved with a
fixed run name (launch/recipe.py), and handed to a ``TorchTrainer`` whose workers run our trainer unchanged
(launch/ray_worker.py). Ray does placement and restarts; we keep our checkpoints: with ``max_failures`` K, a worker
or node that dies makes Ray restart the whole group (up to K times) and the trainer autoresumes from the newest
complete checkpoint in save_folder. Ray's run folder (``storage_path/<run name>``) keeps Ray's own state and the
pointers to our checkpoints; running the driver again with the same run name continues the run.

Works the same under ``ray job submit -- llmfoundry ray ...`` (the driver connects to the job's cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlparse

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.launch.recipe import resolved_recipe
from llmfoundry.train.recipe import cuda_environment, load_train_config
from llmfoundry.train.compat import device_batch_size


@dataclass(frozen=True)
class RayJob:
    """What the Ray run was asked for (the flags of `llmfoundry ray`)."""

    num_workers: int
    gpus_per_worker: float = 0
    cpus_per_worker: float = 1
    storage_path: str | None = None  # Ray's run folders: a folder every node can reach, or s3://
    max_failures: int = 0  # restarts of the worker group after a failure; -1 = without limit
    address: str | None = None  # the cluster (default: RAY_ADDRESS, a cluster started on this machine, or a new one)
    run_name: str | None = None  # wins over the recipe's run_name

    def check(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"--num-workers: {self.num_workers} (use 1 or more)")
        if self.gpus_per_worker < 0:
            raise ConfigError(f"--gpus-per-worker: {self.gpus_per_worker} (use 0 for CPUs, or 1 or more)")
        if self.cpus_per_worker <= 0:
            raise ConfigError(f"--cpus-per-worker: {self.cpus_per_worker} (use more than 0)")
        if self.max_failures < -1:
            raise ConfigError(f"--max-failures: {self.max_failures} (use 0 or more, or -1 for no limit)")
        if self.storage_path and objectstore.is_remote(self.storage_path):
            objectstore.check_url(self.storage_path, "--storage-path")


def ray_recipe(plain: dict, job: RayJob) -> dict:
    """The resolved recipe the workers run: run name fixed, autoresume on when there is a save_folder (so a
    restarted group and a re-run driver continue). Without a save_folder a restart would start over: an error
    with --max-failures, a notice otherwise."""
    if not plain.get("save_folder"):
        if job.max_failures != 0:
            raise ConfigError(f"save_folder: not set, so the {job.max_failures} restart(s) of --max-failures would "
                              "start training over (set save_folder to a folder every node can reach, or s3://)")
        notice_once("save_folder: not set; this Ray run keeps no checkpoints and cannot resume")
    return resolved_recipe(plain, run_name=job.run_name, require_save_folder=False)


def storage(path: str | None) -> str | None:
    """Ray's storage_path. An ``s3://`` path carries, as URI options that pyarrow's S3 filesystem reads
    (``endpoint_override``, ``scheme``, ``region``), the endpoint the rest of llmfoundry uses: S3_ENDPOINT_URL or
    AWS_ENDPOINT_URL_S3 (core/objectstore.py), which pyarrow itself ignores. Every Ray process builds the
    filesystem from it; credentials come from each process's own environment (AWS's usual chain), never from here."""
    if not path:
        return None
    if not objectstore.is_remote(path):
        return str(Path(path).expanduser().resolve())
    objectstore.split_url(path, "--storage-path")
    options = {}
    if endpoint := objectstore.endpoint():
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options.update(endpoint_override=parsed.netloc, scheme=parsed.scheme)
    if region := os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        options["region"] = region
    return path.rstrip("/") + (f"?{urlencode(options)}" if options else "")


def worker_environment(cfg) -> dict[str, str]:
    """Variables the worker processes need from their start: the recipe's CUDA allocator settings."""
    return cuda_environment(cfg, dict(os.environ))


def fit(recipe: str, overrides: list[str] | tuple[str, ...] = (), *, num_workers: int, gpus_per_worker: float = 0,
        cpus_per_worker: float = 1, storage_path: str | None = None, max_failures: int = 0,
        address: str | None = None, run_name: str | None = None):
    """Train ``recipe`` (+ ``overrides``) on ``num_workers`` Ray Train workers; returns Ray's ``Result``.

    Raises ConfigError for bad input (before Ray is started) and Ray's ``TrainingFailedError`` when training
    fails more often than ``max_failures`` allows."""
    job = RayJob(num_workers, gpus_per_worker, cpus_per_worker, storage_path, max_failures, address, run_name)
    job.check()
    cfg, plain = load_train_config(recipe, list(overrides))
    device_batch_size(cfg.global_train_batch_size, num_workers, cfg.tp_config)  # once here, not once per worker
    return run(ray_recipe(plain, job), job, worker_environment(cfg))


def run(recipe: dict, job: RayJob, env: dict[str, str] | None = None):
    """Run the resolved ``recipe`` with Ray Train; returns Ray's ``Result``."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from llmfoundry.launch.ray_worker import train_worker  # the trainer's stack, loaded with Ray's (see STAGED)

    if not ray.is_initialized():  # a caller (a notebook, a test, ray job submit's script) may have connected
        ray.init(address=job.address)
    resources = {"CPU": job.cpus_per_worker}
    if job.gpus_per_worker:
        resources["GPU"] = job.gpus_per_worker
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"recipe": recipe, "cwd": os.getcwd()},
        # Ray makes the process group, so the recipe's dist_timeout must reach it here (Ray's default: 1800 s)
        torch_config=TorchConfig(timeout_s=int(recipe.get("dist_timeout") or 600)),
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.gpus_per_worker > 0,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=recipe["run_name"], storage_path=storage(job.storage_path),
                             failure_config=FailureConfig(max_failures=job.max_failures),
                             worker_runtime_env={"env_vars": env} if env else None),
    )
    return trainer.fit()
