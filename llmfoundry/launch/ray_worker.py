"""What runs on each Ray Train worker: our trainer, unchanged, on the process group Ray made.

Ray Train (V2) runs :func:`train_worker` in a thread of every worker actor, after it has created the process group
(gloo on CPUs, nccl on GPUs) and set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR. The trainer joins that group
(core/dist.py), trains on ``ray.train.torch.get_device()``, and resumes through its own autoresume from the newest
complete checkpoint in save_folder; Ray's ``get_checkpoint()`` is not used. No ``prepare_model`` or
``prepare_data_loader``: they would wrap FSDP2 in DDP and put a sampler under the MDS loader.

:class:`RayReport` tells Ray about each checkpoint we save, without Ray copying it: a small pointer folder in
Ray's run folder (``checkpoints/<name>/llmfoundry_checkpoint.json``) holds where the checkpoint is, and is
reported with ``CheckpointUploadMode.NO_UPLOAD`` (Ray accepts only checkpoints inside its own run folder, so the
pointer is what goes there). Every ``preemption_check_interval`` batches it also asks Ray for a preemption notice
(``ray.train.get_preemption_info``, a collective of all workers) and, on the first one, saves a just-in-time
checkpoint (``TrainState.save_now``, the preemption stop path's save) and keeps training, as Ray
recommends: when the node goes, Ray restarts the group and the trainer resumes from that checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from llmfoundry.core import dist
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.recipe import validate_train_config
from llmfoundry.train.state import TrainState
from llmfoundry.train.trainer import Trainer

POINTER_FILE = "llmfoundry_checkpoint.json"  # in each checkpoint folder Ray's Result knows


def train_worker(config: dict[str, Any]) -> None:
    """The training function of every Ray Train worker; ``config["recipe"]`` is the resolved recipe (a dict)."""
    import ray.train.torch

    recipe = config["recipe"]
    if os.path.isdir(config.get("cwd") or ""):  # relative paths of the recipe mean what they meant on the driver,
        os.chdir(config["cwd"])                 # as under torchrun (one machine, or a shared file system)
    cfg = validate_train_config(recipe)  # validated once on the driver; again here for the typed config
    if cfg.python_log_level:
        logging.getLogger("llmfoundry").setLevel(cfg.python_log_level.upper())
    dist.use_device(ray.train.torch.get_device())
    trainer = Trainer(cfg, recipe)
    trainer.callbacks.append(RayReport())
    trainer.fit()


def _plain_metrics(state: TrainState, metrics: dict[str, float]) -> dict[str, float]:
    report = {k: float(v) for k, v in metrics.items() if k.startswith(("loss/", "metrics/"))}
    report.update({"epoch": state.time.epoch, "batch": state.time.batch, "sample": state.time.sample,
                   "token": state.time.token})
    return report


class RayReport(Callback):
    """Reports our checkpoints to Ray (pointers, no upload) and saves just in time on Ray's preemption notice."""

    def __init__(self):
        self.last_metrics: dict[str, float] = {}
        self.preempted = False

    def on_batch_end(self, state: TrainState, metrics: dict[str, float]) -> None:
        import ray.train

        self.last_metrics = _plain_metrics(state, metrics)
        if self.preempted or state.time.batch % state.preemption.check_interval:
            return
        info = ray.train.get_preemption_info()  # the same answer on every rank (rank 0's)
        if info is None:
            return
        self.preempted = True
        state.print(f"Ray: preemption notice for ranks {info.preempted_ranks}; just-in-time checkpoint at "
                    f"batch {state.time.batch}")
        state.save_now()  # (unless the trainer saves this batch anyway: save_interval, or the end of training)

    def on_checkpoint_saved(self, state: TrainState, path: str) -> None:
        import ray.train

        name = path.rstrip("/").rsplit("/", 1)[-1]
        checkpoint = None
        if state.dist.is_main:
            checkpoint = self._pointer(name, {"path": str(path), "epoch": state.time.epoch,
                                              "batch": state.time.batch, "run_name": state.run_name,
                                              "complete_when": "save_folder/latest names it (s3://: once uploaded)"})
        ray.train.report(dict(self.last_metrics, batch=state.time.batch), checkpoint=checkpoint,
                         checkpoint_dir_name=name,
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD)

    @staticmethod
    def _pointer(name: str, content: dict):
        """A folder in Ray's run folder holding where our checkpoint ``name`` is, as a ray.train.Checkpoint."""
        import ray.train

        storage = ray.train.get_context().get_storage()
        folder = f"{storage.experiment_fs_path.rstrip('/')}/checkpoints/{name}"
        filesystem = storage.storage_filesystem
        filesystem.create_dir(folder, recursive=True)
        with filesystem.open_output_stream(f"{folder}/{POINTER_FILE}") as out:
            out.write(json.dumps(content, indent=1).encode())
        return ray.train.Checkpoint(path=folder, filesystem=filesystem)
