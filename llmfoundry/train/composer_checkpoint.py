"""Checkpoints written by llm-foundry (Composer), read without Composer and without running pickled code.

Two layouts: a monolithic file (``ep0-ba1000-rank0.pt``: ``torch.save`` of ``{"state": {...}, "rng": [...]}``)
and a sharded folder (``ep0-ba1000/`` with DCP's ``.metadata`` and ``__{rank}_0.distcp``, the same dict flattened).
Composer stores its own objects as state dicts of plain values, so the monolithic file is read with
``torch.load(weights_only=True)`` and an allow-list of the few other types it holds (``datetime.timedelta`` in
the timestamp, NumPy's RNG array, ``TorchVersion`` in the metadata); the sharded one through train.dcp_reading.
Anything else in the file is refused with a one-line error, never executed.

What is used: ``state.model`` (names under Composer's wrapper, ``model.``), the optimizer's per-parameter state
(``state.optimizers.<class>``), ``state.schedulers.LambdaLR``, ``state.timestamp``, ``state.dataset_state.train``
(the streaming loader's position), the per-rank RNG, and ``state.integrations.huggingface`` (the model's
config.json and the tokenizer files, for ``llmfoundry convert``). A mixture-of-experts MPT's expert matrices (and
their optimizer state) are moved from llm-foundry's layout to ours on load (layers.moe.expert_weight_from_llm_foundry);
the Hugging Face folder keeps llm-foundry's, which llmfoundry.models.llm_foundry_mpt converts when it reads it.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.torch_version import TorchVersion

from llmfoundry.core.errors import ConfigError, first_line, refusal_reason
from llmfoundry.core.notices import notice_once
from llmfoundry.models.interface import ModelHooks, hooks_of
from llmfoundry.models.layers.moe import expert_weight_from_llm_foundry
from llmfoundry.train.components import Component, restore, select
from llmfoundry.train.composer_moments import MomentScale, fsdp_version_from_order, moment_scale
from llmfoundry.train.dcp_reading import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    as_refusal,
    read_metadata_file,
    unwrap,
)

# Types a Composer monolithic checkpoint holds besides tensors and containers of plain values.
_ALLOWED_GLOBALS = [datetime.timedelta, TorchVersion, np.ndarray, np.dtype, np.core.multiarray._reconstruct,
                    type(np.dtype(np.uint32)), type(np.dtype(np.int64)), type(np.dtype(np.float64))]
# Composer's optimizer classes whose per-parameter state is tensors only -> our optimizer of the same rule.
OPTIMIZERS = {"DecoupledAdamW": "decoupled_adamw", "DecoupledLionW": "decoupled_lionw"}
SHARDED_POINTER = "latest-sharded-rank0"
MONOLITHIC_POINTER = "latest-rank0.pt"


@dataclass
class ComposerCheckpoint:
    """The parts of a Composer checkpoint this project uses (names as Composer wrote them, ``model.`` removed)."""

    path: Path
    model: dict[str, torch.Tensor]
    optimizer_class: str | None = None
    optimizer_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    scheduler: dict[str, Any] | None = None
    timestamp: dict[str, Any] = field(default_factory=dict)
    dataset_state: dict[str, Any] | None = None
    rng: list[dict[str, Any]] = field(default_factory=list)
    hf_config: dict[str, Any] | None = None
    tokenizer_files: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)  # Composer's state.metadata (device, torch_version, ...)
    algorithms: str = ""  # Composer's state.algorithms as text (the algorithms' class names are in it)
    sharded: bool = False


def find_composer_checkpoint(path: str | Path) -> Path | None:
    """The Composer checkpoint at ``path``: a ``*.pt`` file, a sharded checkpoint folder, or a save_folder holding
    Composer's ``latest-rank0.pt`` / ``latest-sharded-rank0`` pointer (a symlink, or its uploaded ``.symlink`` file).
    None when ``path`` is none of these (one of our checkpoints, for instance)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".pt":
        return path
    if path.is_dir() and (path / ".metadata").is_file() and not (path / "rank0.pt").exists():
        return path if _is_composer_metadata(path) else None
    for pointer in (SHARDED_POINTER, MONOLITHIC_POINTER):
        if (path / pointer).exists():
            return (path / pointer).resolve()
        link_file = path / f"{pointer}.symlink"
        if link_file.is_file():
            return path / link_file.read_text().strip()
    return None


def _is_composer_metadata(folder: Path) -> bool:
    keys = read_metadata_file(folder / ".metadata").state_dict_metadata
    return any(key.startswith("state.model.") for key in keys)


def read_composer_checkpoint(path: str | Path, key: str = "load_path") -> ComposerCheckpoint:
    """Everything this project uses from a Composer checkpoint (file or sharded folder), on every rank."""
    path = Path(path)
    raw = _read_sharded(path, key) if path.is_dir() else _read_monolithic(path, key)
    state = raw.get("state")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConfigError(f"{key}: '{path}' is not a Composer checkpoint (no state.model in it)")
    model = {name.removeprefix("model."): value for name, value in state["model"].items()
             if isinstance(value, torch.Tensor)}
    checkpoint = ComposerCheckpoint(path=path, model=model, rng=list(raw.get("rng") or []))
    optimizers = state.get("optimizers") or {}
    if optimizers:
        name, optimizer = next(iter(optimizers.items()))
        checkpoint.optimizer_class = name
        checkpoint.optimizer_state = {k.removeprefix("model."): v for k, v in (optimizer.get("state") or {}).items()}
        checkpoint.param_groups = list(optimizer.get("param_groups") or [])
    checkpoint.scheduler = (state.get("schedulers") or {}).get("LambdaLR")
    checkpoint.timestamp = (state.get("timestamp") or {}).get("Timestamp") or {}
    checkpoint.dataset_state = (state.get("dataset_state") or {}).get("train")
    huggingface = (state.get("integrations") or {}).get("huggingface") or {}
    checkpoint.hf_config = ((huggingface.get("model") or {}).get("config") or {}).get("content")
    checkpoint.tokenizer_files = {name: entry.get("content") for name, entry in
                                  (huggingface.get("tokenizer") or {}).items() if isinstance(entry, dict)}
    checkpoint.metadata = dict(state.get("metadata") or {})
    checkpoint.algorithms = repr(state.get("algorithms") or [])
    checkpoint.world_size = int(checkpoint.metadata.get("world_size") or len(checkpoint.rng) or 1)
    checkpoint.sharded = path.is_dir()
    return checkpoint


def _read_monolithic(path: Path, key: str) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(_ALLOWED_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ConfigError(f"{key}: '{path}' holds objects other than tensors and Composer's plain state, refused "
                          f"unread ({refusal_reason(error)})") from None
    except (RuntimeError, EOFError, OSError) as error:
        raise ConfigError(f"{key}: '{path}' is not a readable checkpoint file ({first_line(error)})") from None


def _read_sharded(folder: Path, key: str) -> dict[str, Any]:
    """The nested state of a Composer sharded checkpoint, rebuilt from DCP's flat keys and their paths."""
    metadata = read_metadata_file(folder / ".metadata")
    paths = metadata.planner_data or {}
    flat: dict[str, Any] = {}
    for name, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            flat[name] = None  # filled in by the planner
        else:
            flat[name] = torch.empty(entry.size, dtype=entry.properties.dtype)
    try:
        with torch.serialization.safe_globals(_ALLOWED_GLOBALS):
            dcp.load(flat, storage_reader=SafeFileSystemReader(str(folder)), planner=SafeLoadPlanner(),
                     no_dist=True)
    except BaseException as error:  # DCP wraps each rank's failure in a CheckpointException (a BaseException)
        cause = unwrap(error)
        refused = as_refusal(error, f"{key}: '{folder}'")
        if refused is not None:
            raise refused from None
        if not isinstance(cause, Exception):
            raise
        raise ConfigError(f"{key}: '{folder}' could not be read as a sharded checkpoint "
                          f"({first_line(cause)})") from None
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        _put(nested, paths.get(name) or tuple(name.split(".")), value)
    return _lists(nested)


def _put(tree: dict, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _lists(tree: Any) -> Any:
    """Dicts keyed 0..n-1 by int (DCP's record of a list) back into lists."""
    if not isinstance(tree, dict):
        return tree
    tree = {k: _lists(v) for k, v in tree.items()}
    if tree and all(isinstance(k, int) for k in tree) and sorted(tree) == list(range(len(tree))):
        return [tree[i] for i in range(len(tree))]
    return tree


def train_time(timestamp: dict[str, Any]) -> dict[str, int]:
    """Composer's Timestamp as our TrainTime fields."""
    return {name: int(timestamp.get(name, 0)) for name in ("epoch", "batch", "batch_in_epoch", "sample", "token")}


def loader_position(checkpoint: ComposerCheckpoint) -> dict[str, Any]:
    """The train loader's position: the streaming dataset's own state when Composer saved one, else the epoch and
    the samples seen in it (what a map-style loader resumes from)."""
    if isinstance(checkpoint.dataset_state, dict) and "sample_in_epoch" in checkpoint.dataset_state:
        return dict(checkpoint.dataset_state)
    return {"epoch": int(checkpoint.timestamp.get("epoch", 0)),
            "sample_in_epoch": int(checkpoint.timestamp.get("sample_in_epoch", 0))}


def rng_state(checkpoint: ComposerCheckpoint, rank: int) -> dict[str, Any] | None:
    """This rank's RNG state in train.checkpoint's format, or None when Composer saved none for it."""
    if rank >= len(checkpoint.rng) or not isinstance(checkpoint.rng[rank], dict):
        return None
    saved = checkpoint.rng[rank]
    if not {"python", "numpy", "torch"} <= set(saved):
        return None
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    state = {"python": saved["python"], "torch": saved["torch"],
             "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if saved.get("cuda") is not None:
        state["cuda"] = saved["cuda"]
    return state


# ----- into a model and optimizer of ours (any world size, FSDP2 or not) -----
def load_into_training(
    checkpoint: ComposerCheckpoint,
    components: dict[str, Component],
    *,
    optimizer_name: str | None,
    weights_only: bool = False,
    strict: bool = True,
    ignore: Any = None,
    rank: int = 0,
    world_size: int = 1,
) -> list[str]:
    """Restore a Composer checkpoint into our run's ``components`` (train.components), mapped onto them: the
    weights (and unless ``weights_only``, optimizer state, time, learning rate, loader position, RNG); returns the
    names restored, as train.checkpoint.load_checkpoint does. ``ignore`` is train.compat.IgnoreKeys (Composer's
    own key names)."""
    chosen = select(components, weights_only=weights_only, ignore=ignore, saving=False)
    model = components["model"].state.model
    where = f"load_path: '{checkpoint.path}'"
    ours = get_model_state_dict(model)
    prefix = _our_prefix(ours, checkpoint.model)
    hooks = hooks_of(model)  # once: a model's hooks may walk its modules
    state = {}
    for name, value in checkpoint.model.items():
        if ignore and ignore.model_key(name):
            continue
        if prefix + name in ours:
            value = _ours(name, value, hooks, ours[prefix + name], f"{where} weight")
            state[prefix + name] = _like(value, ours[prefix + name], f"{where} weight '{name}'")
    missing = sorted(k for k in ours if k not in state and not (ignore and ignore.model_key(k[len(prefix):]))
                     and not (k.endswith("lm_head.weight") and hooks.tie_word_embeddings))
    unexpected = sorted(n for n in checkpoint.model if prefix + n not in ours and not (ignore and ignore.model_key(n)))
    if strict and (missing or unexpected):
        detail = (f"missing {missing[:3]}" if missing else "") + (", " if missing and unexpected else "") + (
            f"unexpected {unexpected[:3]}" if unexpected else "")
        raise ConfigError(f"{where} does not match this run's model ({detail}); make the model section match the "
                          "recipe it was trained with, or set load_strict_model_weights: false")
    set_model_state_dict(model, state, options=StateDictOptions(strict=False))
    loaded = ["model"]
    if "optimizer" in chosen and checkpoint.optimizer_state:
        _load_optimizer(checkpoint, model, chosen["optimizer"].state.optimizer, optimizer_name, prefix, where, ours)
        loaded.append("optimizer")
    states = {
        "time": train_time(checkpoint.timestamp),
        "scheduler": {**checkpoint.scheduler, "lr_lambdas": [None]} if checkpoint.scheduler else None,  # ours is code
        "dataloader": loader_position(checkpoint),
        # on another world size, RNG streams restart from the seed (as for our checkpoints)
        "rng": rng_state(checkpoint, rank) if world_size == checkpoint.world_size else None,
    }  # (Composer's callbacks keep state by class name; none of ours reads it)
    return loaded + restore({n: c for n, c in chosen.items() if c.kind != "sharded"}, states)


def _our_prefix(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What our model puts before Composer's names: nothing for MPT, ``hf_model.`` for hf_causal_lm."""
    for prefix in ("", "hf_model."):
        if any(prefix + name in ours for name in theirs):
            return prefix
    return ""


def _ours(name: str, value: torch.Tensor, hooks: ModelHooks, current: Any, what: str) -> torch.Tensor:
    """A weight (or optimizer state of its shape) of Composer's model in our layout: MoE expert matrices differ (the
    MoE ffn_type the model declares says how llm-foundry laid them out)."""
    return expert_weight_from_llm_foundry(name, value, hooks.moe_ffn_type, current.shape, what)


def _like(value: torch.Tensor, current: Any, what: str) -> Any:
    """``value`` (a full tensor) in the dtype and layout of ``current`` (a DTensor shard under FSDP2)."""
    if tuple(value.shape) != tuple(current.shape):
        raise ConfigError(f"{what} has shape {tuple(value.shape)}, this run's model {tuple(current.shape)}; make "
                          "the model section match the recipe it was trained with")
    value = value.to(dtype=current.dtype)
    if isinstance(current, DTensor):
        return distribute_tensor(value.to(current.device), current.device_mesh, current.placements)
    return value.to(current.device)


def _load_optimizer(checkpoint: ComposerCheckpoint, model, optimizer, optimizer_name, prefix: str, where: str,
                    params: dict[str, Any]):
    """Composer's per-parameter optimizer state and learning rates into our optimizer; our param groups keep their
    own hyperparameters (the recipe's), as Composer rebuilds them from the recipe too."""
    expected = OPTIMIZERS.get(checkpoint.optimizer_class or "")
    if expected is None:
        raise ConfigError(f"{where} holds {checkpoint.optimizer_class} optimizer state, which this project cannot "
                          f"read (readable: {', '.join(OPTIMIZERS)}); set load_weights_only: true to start the "
                          "optimizer afresh")
    if optimizer_name != expected:
        raise ConfigError(f"{where} was trained with optimizer {expected}, this run uses {optimizer_name}; use the "
                          "same optimizer.name, or set load_weights_only: true")
    scale = moments_of(checkpoint)
    if scale.factor != 1 or scale.assumed:
        change = f"divided by {scale.factor:g}" if scale.factor != 1 else "kept"
        notice_once(f"load_path: optimizer moments {change}: {scale.reason}")
    ours = get_optimizer_state_dict(model, optimizer)
    if len(ours["param_groups"]) != len(checkpoint.param_groups):
        raise ConfigError(f"{where} has {len(checkpoint.param_groups)} optimizer param groups, this run "
                          f"{len(ours['param_groups'])}; set load_weights_only: true")
    state = {}
    hooks = hooks_of(model)
    for group in ours["param_groups"]:
        for name in group["params"]:
            saved = checkpoint.optimizer_state.get(name[len(prefix):])
            if saved is None:
                continue
            state[name] = {k: (v.to(torch.float32) if k == "step" else _like(
                _ours(name[len(prefix):], scale.rescale(k, v), hooks, params[name],
                      f"{where} optimizer state ({k}) of"), params[name],
                f"{where} optimizer state '{name}.{k}'")) if isinstance(v, torch.Tensor) else v
                for k, v in saved.items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": ours["param_groups"]},
                             options=StateDictOptions(strict=False))
    for group, saved in zip(optimizer.param_groups, checkpoint.param_groups):
        group["lr"] = float(saved["lr"])  # the learning rate of the next step, as Composer's scheduler left it


def moments_of(checkpoint: ComposerCheckpoint) -> MomentScale:
    """How the checkpoint's optimizer moments relate to our gradients (train/composer_moments.py has the rule)."""
    version = (fsdp_version_from_order(list(checkpoint.model), list(checkpoint.optimizer_state))
               if checkpoint.sharded else None)
    return moment_scale({"world_size": checkpoint.world_size, **checkpoint.metadata}, version,
                        clipped="GradientClipping" in checkpoint.algorithms)


# ----- as a Hugging Face folder (what llm-foundry's convert_composer_to_hf.py writes) -----
def write_hf_folder(checkpoint: ComposerCheckpoint, dest: str | Path, key: str = "checkpoint") -> Path:
    """The checkpoint's model as a Hugging Face folder: the config.json and tokenizer files Composer stored with
    it, and the weights (names under Composer's wrapper) as model.safetensors. An llm-foundry MPT comes out as
    llm-foundry's own export does (``model_type: mpt``; llmfoundry.models.llm_foundry_mpt reads it without its
    code), any other transformers model as its usual folder. Written to a temporary name, then renamed."""
    if not checkpoint.hf_config:
        raise ConfigError(f"{key}: '{checkpoint.path}' holds no Hugging Face config (state.integrations."
                          "huggingface), so the model it holds cannot be rebuilt; it was not saved by llm-foundry's "
                          "mpt_causal_lm or hf_causal_lm")
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # never point at code (auto_map); "_..." keys are transformers' run-time bookkeeping, which save_pretrained drops
    config = {k: v for k, v in checkpoint.hf_config.items() if k != "auto_map" and not k.startswith("_")}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name, content in checkpoint.tokenizer_files.items():
        if Path(name).name != name or content is None:
            continue  # a file name with a path in it is not a tokenizer file Composer wrote
        if name == "tokenizer.json" and isinstance(content, dict):
            content = _restore_empty_containers(content)
        text = content if isinstance(content, str) else json.dumps(content, indent=2)
        (tmp / name).write_text(text)
    tensors, seen = {}, {}
    for name, value in checkpoint.model.items():
        pointer = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if pointer in seen:  # a tied weight saved twice: safetensors stores one copy
            continue
        seen[pointer] = name
        tensors[name] = value.contiguous()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def _restore_empty_containers(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """tokenizer.json as the tokenizers library needs it. A sharded checkpoint keeps only leaves, so an empty dict
    or list vanishes; these are the ones whose absence makes the file unreadable."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.setdefault("added_tokens", [])
    processors = [tokenizer.get("post_processor")]
    while processors:
        processor = processors.pop()
        if isinstance(processor, dict):
            if processor.get("type") == "TemplateProcessing":
                processor.setdefault("special_tokens", {})
            processors += processor.get("processors") or []
    model = tokenizer.get("model")
    if isinstance(model, dict):
        model.setdefault("vocab", {})
        if model.get("type") == "BPE":
            model.setdefault("merges", [])
    return tokenizer
