"""The checkpoint format: sharded torch.distributed.checkpoint (DCP) folders, written atomically, with "latest".

Layout of a save_folder::

    save_folder/
      ep0-ba100/            one complete checkpoint
        .metadata, __*_*.distcp   DCP shards: model and optimizer (resharded on load)
        checksums/rank{r}.json    size and checksum of each file rank r wrote (train.checkpoint_files)
        rank{r}.pt          small state (train.components' shared and per-rank ones): trainer time and scheduler,
                            RNG states, data loader position, stateful callbacks
        config.yaml         the resolved training config (enough to rebuild the model)
        tokenizer/          the tokenizer, so a checkpoint is self-contained
      latest                the name of the newest complete checkpoint

A checkpoint is written under a temporary name and renamed only when every rank has finished; ``latest`` is
replaced (atomically) after that, so a crash mid-save never leaves a "latest" that is incomplete. Where checkpoints
go (local or an object store) and when is train.checkpointer's job.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.train.checkpoint_files import record_checksums, verify_checkpoint
from llmfoundry.train.components import Component, restore, select
from llmfoundry.train.dcp_reading import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    as_refusal,
    load_plain,
    unwrap,
)

LATEST = "latest"
CONFIG_FILE = "config.yaml"
FULL_WEIGHTS = "model_full.pt"
CHECKPOINT_NAME = re.compile(r"^ep(\d+)-ba(\d+)$")
# DCP warns on every call when there is no process group; one process is a normal way to run.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"ep{epoch}-ba{batch}"


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Complete checkpoints in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(2)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT_NAME.match(p.name))
             and (p / ".metadata").exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint that ``folder/latest`` names; the newest complete one when that is gone (a person deleted a
    damaged checkpoint) or ``latest`` is missing; None when there is none."""
    pointer = Path(folder) / LATEST
    if pointer.is_file():
        path = Path(folder) / pointer.read_text().strip()
        if (path / ".metadata").exists():
            return path
    found = list_checkpoints(folder)
    return found[-1] if found else None


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


@dataclass
class Snapshot:
    """What one checkpoint holds, taken at one step: the DCP state (model, optimizer), this rank's ``rank{r}.pt``
    values and, with full_weights, the gathered weights. Writing it needs no collective of the training group."""

    state: dict[str, Any]
    small: dict[str, Any]
    full: dict[str, Any] | None = None


# Where the state of a shared or per-rank component sits in ``rank{r}.pt``: the layout checkpoints have had from the
# start (time and scheduler under "trainer", the loader's position and the RNG at the top). Any other shared
# component sits under "trainer" by its name, any other per-rank one at the top.
TOP_LEVEL = ("dataloader", "rng")


def _slot(small: dict[str, Any], name: str, kind: str) -> dict[str, Any]:
    """The dict of ``small`` (a rank file's contents, which always has a "trainer" dict) holding component ``name``."""
    return small if name in TOP_LEVEL or kind == "per_rank" else small.get("trainer", {})


def _plain_state(name: str, state: Any) -> Any:
    """``state``, once it is known to read back as a checkpoint is read (tensors and plain values only): a state
    that would make its checkpoint unreadable is refused when it is saved, not when a run tries to resume."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"checkpoint component '{name}': its state_dict() holds more than tensors and plain values "
                          "(numbers, strings, lists, dicts), which a checkpoint could not be read back from; keep "
                          "to those") from None
    return state


def take_snapshot(components: dict[str, Component], *, weights_only: bool = False, full_weights: bool = False,
                  ignore: Any = None) -> Snapshot:
    """The state to save (collective with full_weights: every rank calls it). Tensors are the live ones, not
    copies: train.async_save copies them to host memory before training changes them."""
    chosen = select(components, weights_only=weights_only, ignore=ignore, saving=True)
    state = {name: c.state.state_dict() for name, c in chosen.items() if c.kind == "sharded"}
    small: dict[str, Any] = {"trainer": {}, "rng": None, "dataloader": None, "world_size": dist.world_size(),
                             "weights_only": "optimizer" not in state}
    for name, component in chosen.items():
        if component.kind != "sharded":
            _slot(small, name, component.kind)[name] = _plain_state(name, component.state.state_dict())
    full = None
    if full_weights:  # a collective: gathered before the writes, which may fail on one rank only
        model = components["model"].state.model
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return Snapshot(state, small, full)


def save_checkpoint(folder: str | Path, name: str, components: dict[str, Component], *, config: dict[str, Any],
                    tokenizer: Any, overwrite: bool, keep: int = -1, publish: bool = True, **options: Any) -> Path:
    """Write one checkpoint of ``components`` (collective: every rank calls it) and point ``latest`` at it; returns
    its path. ``options``: :func:`take_snapshot`'s: ``weights_only`` leaves the optimizer state out;
    ``full_weights`` also writes the gathered model weights as ``model_full.pt`` (rank 0); ``ignore``
    (train.compat.IgnoreKeys, from save_ignore_keys): state left out. The rest as in :func:`write_snapshot`.
    """
    return write_snapshot(folder, name, take_snapshot(components, **options), config=config, tokenizer=tokenizer,
                          overwrite=overwrite, keep=keep, publish=publish)


def write_snapshot(
    folder: str | Path,
    name: str,
    snapshot: Snapshot,
    *,
    config: dict[str, Any],
    tokenizer: Any,
    overwrite: bool,
    keep: int = -1,
    publish: bool = True,
) -> Path:
    """Write ``snapshot`` as checkpoint ``name`` (collective over the default process group: in save_async's writer
    processes, train.checkpoint_writer, a gloo group of the writers alone, whose collectives never meet the training
    loop's) and point ``latest`` at it; returns its path.

    ``publish=False`` writes straight into ``folder/name`` with no rename, ``latest`` or retention: used for the
    staging folder of an s3:// save_folder, where the upload's completion marker plays that role.
    """
    folder = Path(folder)
    final = folder / name
    target = folder / f".{name}.partial" if publish else final
    problem = None
    if dist.rank() == 0:
        if publish and final.exists() and not overwrite:
            problem = (f"save_folder: checkpoint '{final}' already exists (set save_overwrite: true or choose "
                       "another save_folder)")
        else:
            if publish and final.exists():
                shutil.rmtree(final)
            shutil.rmtree(target, ignore_errors=True)
    if (problem := gather_object(problem)[0]) is not None:  # every rank stops, none waits for rank 0
        raise ConfigError(problem)
    target.mkdir(parents=True, exist_ok=True)  # every rank: a staging folder may be local to each node

    try:  # every rank learns whether any rank failed, so none waits for the others at the barrier below
        dcp.save(snapshot.state, checkpoint_id=str(target))
        torch.save(snapshot.small, target / f"rank{dist.rank()}.pt")
        if snapshot.full is not None and dist.rank() == 0:
            torch.save(snapshot.full, target / FULL_WEIGHTS)
        if dist.rank() == 0:
            (target / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(target / "tokenizer"))
        record_checksums(target, dist.rank())  # after this rank's last file: loading checks them first
        problem = None
    except (OSError, RuntimeError, CheckpointException) as error:  # disk full, folder gone, a rank's write failed
        problem = first_line(unwrap(error))
    if problems := [p for p in gather_object(problem) if p is not None]:
        shutil.rmtree(target, ignore_errors=True)  # a partial checkpoint is never read; its space is needed
        raise ConfigError(f"save_folder: could not write checkpoint '{name}' in '{folder}' ({problems[0]}); the "
                          "checkpoints saved before it are intact: fix the cause (e.g. free disk space) and run again "
                          "to resume from the newest")

    if publish and dist.rank() == 0:
        os.replace(target, final)
        _write_atomically(folder / LATEST, name + "\n")
        if keep > 0:
            for old in list_checkpoints(folder)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier("barrier after publishing a checkpoint")
    return final


def write_job(snapshot: Snapshot, *, name: str, folder: str | Path, remote: bool, overwrite: bool, keep: int,
              config: dict[str, Any], tokenizer: Any) -> tuple[Path | None, str | None]:
    """Write ``snapshot`` as checkpoint ``name`` of a save_folder (collective), as a synchronous save and
    save_async's writer process both do: published in ``folder`` when the save_folder is local; else staged in
    ``folder`` (the staging folder) for this rank's upload, and then returns the staged folder and the upload's
    attempt id (the same on every rank: it names the folder of that save's per-rank upload markers)."""
    if not remote:
        write_snapshot(folder, name, snapshot, config=config, tokenizer=tokenizer, overwrite=overwrite, keep=keep)
        return None, None
    staged = write_snapshot(folder, name, snapshot, config=config, tokenizer=tokenizer, overwrite=True,
                            publish=False)
    return staged, gather_object(uuid.uuid4().hex[:12] if dist.rank() == 0 else None)[0]


def gather_object(obj: Any) -> list:
    """Every rank's ``obj`` in rank order; ``[obj]`` alone."""
    return dist.all_gather_object(obj, "all_gather_object (checkpoint save)")


def load_checkpoint(path: str | Path, components: dict[str, Component], *, weights_only: bool = False,
                    strict: bool = True, ignore: Any = None) -> list[str]:
    """Restore ``components`` from a checkpoint of ours written on any world size; returns the names restored.

    ``weights_only`` reads the model alone; ``ignore`` (train.compat.IgnoreKeys, from load_ignore_keys): state left
    as it is. Per-rank state (RNG) is restored on the world size that wrote it only: elsewhere its streams restart
    from the seed.
    """
    path = resolve_checkpoint(path)
    verify_checkpoint(path)
    rank0_file = path / "rank0.pt"
    rank0 = _read_small_state(rank0_file) if rank0_file.exists() else {}
    chosen = select(components, weights_only=weights_only, ignore=ignore, saving=False)
    if rank0.get("weights_only", False):  # a weights-only checkpoint has no optimizer state to read
        chosen = {name: c for name, c in chosen.items() if c.kind != "sharded" or c.weights}
    sharded = {name: c for name, c in chosen.items() if c.kind == "sharded"}
    state = {name: c.state.state_dict() for name, c in sharded.items()}  # what to read, and where to
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)),
                 planner=SafeLoadPlanner(allow_partial_load=not strict))
    except (RuntimeError, KeyError, CheckpointException, ConfigError) as error:
        refused = as_refusal(error, f"load_path: '{path}'")  # something other than plain state: never run
        if refused is not None:
            raise refused from None
        failure = _load_failure(error)
        if "optimizer" in failure:
            hint = "set load_weights_only: true to load the model weights alone"
        else:  # the model section differs from the one the checkpoint was trained with
            hint = ("make the model section match the checkpoint's config.yaml, or set load_strict_model_weights: "
                    "false to load only the weights that match")
        raise ConfigError(f"load_path: '{path}' does not match this run ({failure}); {hint}") from None
    loaded = restore(sharded, state)
    rest = {name: c for name, c in chosen.items() if c.kind != "sharded"}
    if not rest:
        return loaded
    if not rank0_file.exists() and any(c.kind == "shared" for c in rest.values()):
        raise ConfigError(f"load_path: '{path}' has no rank0.pt (the trainer's time, schedule and data position); "
                          "resume from another checkpoint, or set load_weights_only: true to start from its weights")
    rank_file = path / f"rank{dist.rank()}.pt"
    per_rank = _read_small_state(rank_file) if rank_file.exists() else {}
    same_world = bool(per_rank) and per_rank.get("world_size") == dist.world_size()
    states = {}
    for name, component in rest.items():
        if component.kind == "per_rank":
            if same_world:
                states[name] = _slot(per_rank, name, "per_rank").get(name)
        else:
            states[name] = _slot(rank0, name, "shared").get(name)
    return loaded + restore(rest, states)


def _read_small_state(path: Path) -> dict[str, Any]:
    """A ``rank{r}.pt`` file: tensors and plain types only. A file that needs anything else to unpickle (code a
    checkpoint from an untrusted store could run) is refused, never executed."""
    return load_plain(path, f"load_path: '{path}'")


def _load_failure(error: BaseException) -> str:
    """The first line of what went wrong, unwrapped from DCP's per-rank CheckpointException (a BaseException)."""
    error = unwrap(error)
    return first_line(error).strip("'\"").rstrip(".")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    path = resolve_checkpoint(path, key="checkpoint")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise ConfigError(f"checkpoint '{path}' has no {CONFIG_FILE}; it was not written by llmfoundry")
    try:
        return yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:  # e.g. a !!python tag: safe_load refuses to run it
        raise ConfigError(f"checkpoint '{path}': {CONFIG_FILE} is not plain YAML, refused ({first_line(error)})"
                          ) from None
