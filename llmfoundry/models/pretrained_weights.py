"""Pretrained weights read from safetensors straight into a model's own (possibly sharded) tensors.

A model built on the meta device from a pretrained folder (``init_device: meta`` or ``mixed``) carries a
``PretrainedWeights`` (attribute ``pretrained_weights``); ``train/parallel.py`` allocates the model's tensors —
after sharding with FSDP2 — and calls ``fill``. Each rank then reads from the files only the slices its own
shards hold, so a node's ranks hold about one copy of the weights between them, however many ranks it runs, and
no rank ever holds a full copy next to its shards.

safetensors maps a file into memory and the pages a read touches stay in the process's resident set until the
file is closed, so each file is opened for one tensor at a time: what a rank holds beyond its shards is then at
most one tensor's slice of mapped pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once

INDEX = "model.safetensors.index.json"

# a model tensor's name -> the names it may have in one folder's files, most likely first
KeyMap = Callable[[str], list[str]]


def safetensors_files(folder: str | Path, key: str) -> dict[str, Path]:
    """tensor name -> the file holding it, for a folder with ``model.safetensors`` (or an index of shards) or an
    adapter folder's ``adapter_model.safetensors``."""
    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{key}: '{folder}' holds no .safetensors weights, which init_device meta/mixed reads "
                          "shard by shard (re-save it with save_pretrained(safe_serialization=True) or set "
                          "model.init_device: cpu)")
    names: dict[str, Path] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            names.update(dict.fromkeys(f.keys(), file))
    return names


class PretrainedWeights:
    """Where a meta-built model's weights are: (files, key map) pairs, tried in order for each tensor."""

    def __init__(self, sources: list[tuple[dict[str, Path], KeyMap]], key: str):
        self.sources = sources
        self.key = key  # the config key named in errors
        self._shapes: dict[Path, dict[str, tuple[int, ...]]] = {}  # file -> tensor name -> shape, read once

    def locate(self, names: list[str]) -> tuple[Path, str] | None:
        """The (file, tensor name) holding the tensor known under any of ``names`` (aliases of tied weights)."""
        for files, key_map in self.sources:
            for name in names:
                for stored in key_map(name):
                    if stored in files:
                        return files[stored], stored
        return None

    def provided(self, model: nn.Module) -> set[int]:
        """ids of the model's parameters and persistent buffers that the files hold in full (a grown embedding is
        initialised first, then its leading rows are read)."""
        found = ((t, self.locate(names)) for names, t in _named_tensors(model))
        return {id(t) for t, where in found if where is not None and self._shape(*where) == tuple(t.shape)}

    def _shape(self, file: Path, stored: str) -> tuple[int, ...]:
        if file not in self._shapes:
            with safe_open(file, framework="pt") as f:
                self._shapes[file] = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        return self._shapes[file][stored]

    @torch.no_grad()
    def fill(self, model: nn.Module) -> None:
        """Copy each tensor's local part (its FSDP2 shard, or all of it) from the files; tensors the files do not
        hold keep their initial values, as with transformers' from_pretrained."""
        missing = []
        for names, tensor in _named_tensors(model):
            found = self.locate(names)
            if found is None:
                missing.append(names[0])
                continue
            _read_local_part(tensor, *found, self.key)
        if missing:
            notice_once(f"{self.key}: {len(missing)} tensors are not in the pretrained files and keep their initial "
                        f"values ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")


def _named_tensors(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """(every name, tensor) of each parameter and persistent buffer; tied weights appear once with all names."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
        tensors[id(param)] = param
    persistent = set(model.state_dict(keep_vars=True))
    for name, buffer in model.named_buffers(remove_duplicate=False):
        if name in persistent:
            names.setdefault(id(buffer), []).append(name)
            tensors[id(buffer)] = buffer
    return [(names[i], tensors[i]) for i in names]


def _read_local_part(tensor: torch.Tensor, file: Path, stored: str, key: str) -> None:
    if isinstance(tensor, DTensor):  # FSDP2: this rank's shard, at its offset in the full tensor
        local = tensor.to_local()
        offsets = tuple(tensor.__create_chunk_list__()[0].offsets)
    else:
        local, offsets = tensor, (0,) * tensor.dim()
    with safe_open(file, framework="pt") as f:
        view = f.get_slice(stored)
        shape = tuple(view.get_shape())
        full = tuple(tensor.shape)
        # a grown embedding (allow_embedding_resizing) keeps its initial values in the rows the file lacks
        grown = len(shape) == len(full) > 0 and shape[1:] == full[1:] and shape[0] < full[0]
        if shape != full and not grown:
            raise ConfigError(f"{key}: '{stored}' has shape {list(shape)} in {file.name}, the model expects "
                              f"{list(full)} (check model.config_overrides)")
        if local.dim() == 0:
            local.copy_(f.get_tensor(stored))
            return
        rows = max(0, min(local.shape[0], shape[0] - offsets[0]))
        if rows == 0:
            return
        slices = (slice(offsets[0], offsets[0] + rows),
                  *(slice(o, o + n) for o, n in zip(offsets[1:], local.shape[1:])))
        local[:rows].copy_(view[slices])
