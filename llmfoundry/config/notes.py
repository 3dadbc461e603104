"""What a recipe's keys do here that differs from llm-foundry: the ``differs=`` notes of the keys a recipe sets.

``recipe_notes(data, TrainConfig)`` walks a recipe (plain containers, as loaded) beside the schema, through nested
sections, lists and mappings of sections and registered components (``model: {name: ...}``, ``callbacks: {...}``),
and returns ``(key path, note)`` for every key the recipe sets, to another value than its default, whose
``option`` carries a ``differs`` note. Keys the schema does not know are the validator's business and are skipped.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Union, get_args, get_origin

from llmfoundry.config.fields import difference
from llmfoundry.config.validate import Registered, RegisteredMap, is_default


def recipe_notes(data: Any, cls: type, path: str = "") -> list[tuple[str, str]]:
    """``(key path, note)`` for every key set in ``data`` whose field in ``cls`` has a ``differs`` note."""
    notes: list[tuple[str, str]] = []
    _walk_section(data, cls, path, notes)
    return notes


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk_section(data: Any, cls: type, path: str, notes: list[tuple[str, str]]) -> None:
    if not isinstance(data, dict):
        return
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        key = _join(path, f.name)
        note = difference(f)
        if note and not is_default(f, data[f.name]):  # a key written at its default behaves as by default
            notes.append((key, note))
        _walk_value(data[f.name], hints[f.name], key, notes)


def _walk_value(value: Any, tp: Any, path: str, notes: list[tuple[str, str]]) -> None:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *marks = get_args(tp)
        for mark in marks:
            if isinstance(mark, Registered) and isinstance(value, dict):
                _walk_component(value.get("name"), value, mark.registry, path, notes)
                return
            if isinstance(mark, RegisteredMap) and isinstance(value, dict):
                for name, settings in value.items():
                    _walk_component(name, settings, mark.registry, _join(path, str(name)), notes)
                return
        _walk_value(value, base, path, notes)
    elif dataclasses.is_dataclass(tp):
        _walk_section(value, tp, path, notes)
    elif origin in (Union, types.UnionType):
        for member in get_args(tp):  # the member that describes a value of this shape (a mapping or a list)
            shape = list if get_origin(member) is list else dict
            if (dataclasses.is_dataclass(member) or get_origin(member) in (list, dict, Annotated)) \
                    and isinstance(value, shape):
                _walk_value(value, member, path, notes)
                return
    elif origin is list and isinstance(value, list):
        (item,) = get_args(tp) or (Any,)
        for i, v in enumerate(value):
            _walk_value(v, item, f"{path}[{i}]", notes)
    elif origin is dict and isinstance(value, dict):
        _, item = get_args(tp) or (str, Any)
        for k, v in value.items():
            _walk_value(v, item, _join(path, str(k)), notes)


def _walk_component(name: Any, settings: Any, registry: Any, path: str, notes: list[tuple[str, str]]) -> None:
    if not isinstance(name, str) or name not in registry:
        return
    entry = registry.get(name)
    if entry.differs:
        notes.append((path if path.endswith(name) else f"{path}.name={name}", entry.differs))
    if entry.config is not None:
        _walk_section(settings, entry.config, path, notes)
