"""Checkpoints: sharded torch.distributed.checkpoint (DCP) folders, written atomically, with a "latest" pointer.

Layout of a save_folder::

    save_folder/
      ep0-ba100/            one complete checkpoint
        .metadata, __*_*.distcp   DCP shards: model and optimizer (resharded on load)
        rank{r}.pt          small per-rank state: trainer time and scheduler, RNG states, data loader position
        config.yaml         the resolved training config (enough to rebuild the model)
        tokenizer/          the tokenizer, so a checkpoint is self-contained
      latest                the name of the newest complete checkpoint

A checkpoint is written under a temporary name and renamed only when every rank has finished; ``latest`` is
replaced (atomically) after that, so a crash mid-save never leaves a "latest" that is incomplete.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from llmfoundry.config.errors import ConfigError, first_line
from llmfoundry.train import dist

LATEST = "latest"
CONFIG_FILE = "config.yaml"
FULL_WEIGHTS = "model_full.pt"
_NAME = re.compile(r"^ep(\d+)-ba(\d+)$")
# DCP warns on every call when there is no process group; one process is a normal way to run.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"ep{epoch}-ba{batch}"


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Complete checkpoints in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(2)), p) for p in folder.iterdir() if p.is_dir() and (m := _NAME.match(p.name))
             and (p / ".metadata").exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint that ``folder/latest`` names, if it is there."""
    pointer = Path(folder) / LATEST
    if not pointer.is_file():
        return None
    path = Path(folder) / pointer.read_text().strip()
    return path if (path / ".metadata").exists() else None


def resolve_checkpoint(path: str | Path, key: str = "load_path") -> Path:
    """A checkpoint folder from either a checkpoint folder or a save_folder (whose ``latest`` is used)."""
    path = Path(path)
    if (path / ".metadata").exists():
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    if not path.exists():
        raise ConfigError(f"{key}: '{path}' does not exist")
    raise ConfigError(f"{key}: '{path}' is neither a checkpoint folder (no .metadata) nor a save_folder with a "
                      f"'{LATEST}' checkpoint")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    folder: str | Path,
    name: str,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    loader_state: dict[str, Any] | None,
    config: dict[str, Any],
    tokenizer: Any,
    overwrite: bool,
    keep: int = -1,
    weights_only: bool = False,
    full_weights: bool = False,
    publish: bool = True,
) -> Path:
    """Write one checkpoint (collective: every rank calls it) and point ``latest`` at it; returns its path.

    ``weights_only``: leave the optimizer state out. ``full_weights``: also write the gathered model weights as
    ``model_full.pt`` (rank 0). ``publish=False`` writes straight into ``folder/name`` with no rename, ``latest``
    or retention: used for the staging folder of an s3:// save_folder, where the upload's completion marker
    plays that role.
    """
    folder = Path(folder)
    final = folder / name
    target = folder / f".{name}.partial" if publish else final
    if dist.rank() == 0:
        if publish and final.exists():
            if not overwrite:
                raise ConfigError(f"save_folder: checkpoint '{final}' already exists (set save_overwrite: true "
                                  "or choose another save_folder)")
            shutil.rmtree(final)
        shutil.rmtree(target, ignore_errors=True)
    dist.barrier()
    target.mkdir(parents=True, exist_ok=True)  # every rank: a staging folder may be local to each node

    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None and not weights_only:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=str(target))
    torch.save({"trainer": trainer_state, "rng": _rng_state(), "dataloader": loader_state,
                "world_size": dist.world_size(), "weights_only": weights_only or optimizer is None},
               target / f"rank{dist.rank()}.pt")
    if full_weights:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.rank() == 0:
            torch.save(full, target / FULL_WEIGHTS)
    if dist.rank() == 0:
        (target / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(target / "tokenizer"))
    dist.barrier()

    if publish and dist.rank() == 0:
        os.replace(target, final)
        _write_atomically(folder / LATEST, name + "\n")
        if keep > 0:
            for old in list_checkpoints(folder)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    weights_only: bool = False,
    strict: bool = True,
) -> dict[str, Any]:
    """Restore model (and unless ``weights_only``, optimizer, RNG) from a checkpoint on any world size.

    Returns ``{"trainer": {...}, "dataloader": {...} | None}`` (empty when ``weights_only``).
    """
    path = resolve_checkpoint(path)
    options = StateDictOptions(strict=strict)
    rank0_file = path / "rank0.pt"
    rank0 = torch.load(rank0_file, weights_only=False) if rank0_file.exists() else {}
    with_optimizer = not weights_only and optimizer is not None and not rank0.get("weights_only", False)
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if with_optimizer:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=not strict))
    except (RuntimeError, KeyError, CheckpointException) as error:
        failure = _load_failure(error)
        if "optimizer" in failure:
            hint = "set load_weights_only: true to load the model weights alone"
        else:  # the model section differs from the one the checkpoint was trained with
            hint = ("make the model section match the checkpoint's config.yaml, or set load_strict_model_weights: "
                    "false to load only the weights that match")
        raise ConfigError(f"load_path: '{path}' does not match this run ({failure}); {hint}") from None
    set_model_state_dict(model, state["model"], options=options)
    if weights_only:
        return {}
    if with_optimizer:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    rank_file = path / f"rank{dist.rank()}.pt"
    per_rank = torch.load(rank_file, weights_only=False) if rank_file.exists() else rank0
    if rank_file.exists() and per_rank.get("world_size") == dist.world_size():
        _set_rng_state(per_rank["rng"])  # on another world size, RNG streams restart from the seed
    return {"trainer": rank0["trainer"], "dataloader": rank0.get("dataloader")}


def _load_failure(error: BaseException) -> str:
    """The first line of what went wrong, unwrapped from DCP's per-rank CheckpointException (a BaseException)."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    return first_line(error).strip("'\"").rstrip(".")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    path = resolve_checkpoint(path, key="checkpoint")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise ConfigError(f"checkpoint '{path}' has no {CONFIG_FILE}; it was not written by llmfoundry")
    return yaml.safe_load(config_file.read_text())


def load_model_for_inference(path: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer) from one of our checkpoints, on ``device`` in eval mode."""
    from llmfoundry.config.schema import TrainConfig, validate
    from llmfoundry.data.tokenizers import load_saved_tokenizer
    from llmfoundry.train.builders import build_model, build_tokenizer

    path = resolve_checkpoint(path, key="checkpoint")
    cfg = validate(read_checkpoint_config(path), TrainConfig)
    tokenizer_dir = path / "tokenizer"
    tokenizer = load_saved_tokenizer(tokenizer_dir) if tokenizer_dir.is_dir() else build_tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    load_checkpoint(path, model=model, optimizer=None, weights_only=True)
    return model.to(device).eval(), tokenizer


class Checkpointer:
    """Saves to a local or ``s3://`` save_folder and finds the checkpoint to resume from.

    Local: :func:`save_checkpoint` with an atomic rename and ``latest``. S3: the checkpoint is written to a local
    staging folder and uploaded by this rank's background :class:`~llmfoundry.train.remote.Uploader`; training
    goes on meanwhile, and the checkpoint becomes ``latest`` only once every rank's files are up.
    """

    def __init__(self, save_folder: str | None, upload_cfg=None, *, keep: int = -1, overwrite: bool = False):
        from llmfoundry.train import remote

        self.save_folder = save_folder
        self.keep = keep
        self.overwrite = overwrite
        self.upload_cfg = upload_cfg
        self.remote = remote.is_remote(save_folder)
        self.uploader: remote.Uploader | None = None
        if self.remote:
            self.staging = remote.staging_root(save_folder, upload_cfg.staging_folder if upload_cfg else None)
            kwargs = {}
            if upload_cfg is not None:
                kwargs = dict(timeout_s=upload_cfg.timeout_s, initial_backoff_s=upload_cfg.initial_backoff_s,
                              max_backoff_s=upload_cfg.max_backoff_s)
            self.uploader = remote.Uploader(save_folder, dist.rank(), **kwargs)

    def save(self, name: str, **kwargs) -> str:
        """Write checkpoint ``name`` (collective); returns where it is (or will be, once uploaded)."""
        from llmfoundry.train import remote

        if not self.remote:
            return str(save_checkpoint(self.save_folder, name, overwrite=self.overwrite, keep=self.keep, **kwargs))
        staged = save_checkpoint(self.staging, name, overwrite=True, publish=False, **kwargs)
        attempt = dist.broadcast_object(uuid.uuid4().hex[:12] if dist.rank() == 0 else None)
        self.uploader.submit(remote.UploadJob(name, staged, dist.world_size(), self.keep, attempt))
        return f"{self.save_folder.rstrip('/')}/{name}"

    def check_can_write(self, resuming: bool) -> None:
        """Fail up front, not at the first save in the middle of training, when save_folder would overwrite
        another run's checkpoints or (s3://) cannot be reached."""
        from llmfoundry.train import remote

        if not self.save_folder:
            return
        problem = None
        if dist.rank() == 0:
            try:
                if self.remote:
                    existing = remote.RemoteFolder(self.save_folder).complete_checkpoints()
                else:
                    existing = [p.name for p in list_checkpoints(self.save_folder)]
                if existing and not (self.overwrite or resuming):
                    problem = (f"save_folder: '{self.save_folder}' already holds checkpoints ({existing[-1]}); set "
                               "autoresume: true to continue, save_overwrite: true, or choose another save_folder")
            except ConfigError as error:
                problem = str(error)
            except Exception as error:  # noqa: BLE001 - boto raises many types; all mean "cannot use this folder"
                problem = str(remote.explain(error, self.save_folder, "save_folder"))
        if (problem := dist.broadcast_object(problem)) is not None:
            raise ConfigError(problem)

    def metrics(self) -> dict[str, float]:
        from llmfoundry.train import remote

        return remote.describe(self.uploader)

    def finish(self, timeout_s: float) -> bool:
        """Wait for pending uploads (every rank); False if some did not finish or failed."""
        if self.uploader is None:
            return True
        done = self.uploader.close(timeout_s)
        return done and not self.uploader.failed

    def latest(self) -> str | None:
        """The newest complete checkpoint in save_folder as a local path (downloaded when remote), or None."""
        if not self.save_folder:
            return None
        if not self.remote:
            path = latest_checkpoint(self.save_folder)
            return str(path) if path is not None else None
        from llmfoundry.train import remote

        found = None
        if dist.rank() == 0:
            try:
                found = ("ok", remote.RemoteFolder(self.save_folder).latest())
            except Exception as error:  # noqa: BLE001 - boto's errors: no such bucket, unreachable endpoint, ...
                found = ("error", str(remote.explain(error, self.save_folder, "save_folder")))
        status, name = dist.broadcast_object(found)
        if status == "error":
            raise ConfigError(name)
        if name is None:
            return None
        return fetch(self.save_folder, name, self.staging)


def fetch(url: str, name: str, staging: Path) -> str:
    """Download checkpoint ``name`` of the s3:// save_folder ``url`` (one rank per node) and return its path."""
    import os

    from llmfoundry.train import remote

    dest = Path(staging) / "downloads"
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        remote.RemoteFolder(url).download(name, dest)
    dist.barrier()
    return str(dest / name)


def remote_staging(path: str, upload_cfg=None) -> Path:
    from llmfoundry.train import remote

    return remote.staging_root(path, upload_cfg.staging_folder if upload_cfg is not None else None)


def resolve_load_path(path: str, staging: Path) -> str:
    """A local checkpoint path for ``load_path`` (an s3:// checkpoint or save_folder is downloaded first)."""
    from llmfoundry.train import remote

    if not remote.is_remote(path):
        return path
    found: tuple[str, str] | str | None = None
    if dist.rank() == 0:
        try:
            folder, name = remote.resolve_remote(path)
            found = (folder.url, name)
        except ConfigError as error:
            found = str(error)
        except Exception as error:  # noqa: BLE001 - boto's errors: no such bucket, unreachable endpoint, ...
            found = str(remote.explain(error, path, "load_path"))
    found = dist.broadcast_object(found)
    if isinstance(found, str):
        raise ConfigError(found)
    return fetch(found[0], found[1], staging)


def stage_model_path(path: str, key: str = "load_path") -> str:
    """A local path for a model path: ``path`` itself unless it is ``s3://``, in which case one of our checkpoints
    (or a save_folder's newest complete one), or a Hugging Face folder (recognised by its ``config.json``), is
    downloaded into the staging folder and the local copy's path returned. Used by eval, generate, chat, convert."""
    from llmfoundry.train import remote

    if not remote.is_remote(path):
        return path
    staging = remote_staging(path)
    try:
        url = path.rstrip("/")
        parent, _, last = url.rpartition("/")
        if parent != "s3:/" and remote.RemoteFolder(url).exists("config.json"):  # a Hugging Face folder
            return fetch(parent, last, staging)
        return resolve_load_path(url, staging)
    except ConfigError as error:  # resolve_load_path names load_path; say which key it really was
        raise error.rekeyed("load_path", key) from None
    except Exception as error:  # noqa: BLE001 - botocore: no credentials, no endpoint, access denied, ...
        raise remote.explain(error, path, key) from None
