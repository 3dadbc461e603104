"""Read torch.distributed.checkpoint (DCP) folders without running code pickled into them.

DCP pickles two things: the ``.metadata`` file (its own dataclasses) and every non-tensor value, which its default
planner reads back with an unrestricted ``torch.load``: a checkpoint from an untrusted store could run code on
load. ``SafeFileSystemReader`` unpickles the metadata with an allow-list of DCP's metadata types, and
``SafeLoadPlanner`` reads non-tensor values with ``torch.load(weights_only=True)``; tensors were already read that
way. Both refuse anything else with a one-line ConfigError. Used for our checkpoints and for Composer's.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed.checkpoint.filesystem
import torch.distributed.checkpoint.metadata
import torch.distributed.checkpoint.planner
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from llmfoundry.core.errors import ConfigError, first_line, refusal_reason

# The types a DCP .metadata file is made of (torch 2.4 to 2.13 write the same ones).
_METADATA_MODULES = {module.__name__: module for module in (torch.distributed.checkpoint.metadata,
                                                             torch.distributed.checkpoint.filesystem,
                                                             torch.distributed.checkpoint.planner)}
_PLAIN = {("collections", "OrderedDict"): OrderedDict, ("torch", "Size"): torch.Size,
          ("pathlib", "PosixPath"): pathlib.PosixPath, ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
          ("pathlib", "WindowsPath"): pathlib.PurePosixPath, ("pathlib", "PureWindowsPath"): pathlib.PurePosixPath,
          ("pathlib._local", "PosixPath"): pathlib.PosixPath, ("builtins", "set"): set,
          ("builtins", "frozenset"): frozenset}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return _PLAIN[(module, name)]
        if module in _METADATA_MODULES and not name.startswith("__"):
            found = getattr(_METADATA_MODULES[module], name, None)
            if isinstance(found, type):
                return found
        if module == "torch.serialization" and name == "_get_layout":
            return torch.serialization._get_layout
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"'{module}.{name}' is not part of a DCP metadata file")


def read_metadata_file(path: str | pathlib.Path) -> Metadata:
    """A DCP ``.metadata`` file, unpickled with the allow-list (ConfigError naming the file otherwise)."""
    try:
        with open(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as error:
        raise ConfigError(f"{path}: not a checkpoint metadata file this version can read, or it holds more than "
                          f"DCP's own records; refused unread ({first_line(error)})") from None
    if not isinstance(metadata, Metadata):
        raise ConfigError(f"{path}: not a DCP metadata file (it holds a {type(metadata).__name__})")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata is read with the allow-list above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata_file(pathlib.Path(self.path) / ".metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load_plain(source: io.BytesIO | str | pathlib.Path, where: str) -> Any:
    """One non-tensor DCP value or a small state file: tensors and plain types only (``torch.load(weights_only=
    True)``, plus whatever ``torch.serialization.safe_globals`` allows around the call); ``where`` names it."""
    try:
        return torch.load(source, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ConfigError(f"{where} holds more than tensors and plain values, refused unread "
                          f"({refusal_reason(error)})") from None


def as_refusal(error: BaseException, where: str) -> ConfigError | None:
    """The one-line error for a DCP read that met something other than plain state (refused by this module or by
    torch's ``weights_only`` reader of a stored tensor), or None for any other failure."""
    cause = unwrap(error)
    if isinstance(cause, ConfigError):
        return ConfigError(f"{where}: {cause}")
    if isinstance(cause, pickle.UnpicklingError):
        return ConfigError(f"{where}: a stored tensor holds more than tensors and plain values, refused unread "
                           f"({refusal_reason(cause)})")
    return None


def unwrap(error: BaseException) -> BaseException:
    """The first rank's own exception from DCP's per-rank CheckpointException (a BaseException)."""
    if isinstance(error, CheckpointException) and error.failures:
        failure = next(iter(error.failures.values()))
        return failure[0] if isinstance(failure, tuple) else failure
    return error


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = load_plain(value, f"checkpoint value '{read_item.dest_index.fqn}'")
        if self.flatten_state_dict:
            self._set_flat(self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded

    def _set_flat(self, path: tuple, value: Any) -> None:
        """Put ``value`` at ``path`` of the original (nested) state dict, as DCP's set_element does."""
        node = self.original_state_dict
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
