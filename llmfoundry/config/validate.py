"""Check a plain config mapping against typed dataclasses, collecting every problem before reporting.

``validate(data, TrainConfig)`` returns a TrainConfig instance or raises one ConfigError listing all problems:
unknown keys (with the closest valid key), wrong types (with the expected type), missing required keys, values
outside a Literal's choices, and keys that exist but are not supported yet. Sections whose shape depends on a
registered name (``model: {name: mpt_causal_lm, ...}``) are checked against the dataclass the builder registered.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from llmfoundry.config.fields import unsupported_reason
from llmfoundry.core.errors import ConfigError, closest, did_you_mean


@dataclass
class Component:
    """A registered component chosen by name, with its validated settings (an instance of its config class)."""

    name: str
    settings: Any


@dataclass(frozen=True)
class Registered:
    """Type marker: a mapping with a ``name`` key that selects a builder from ``registry``."""

    registry: Any


@dataclass(frozen=True)
class RegisteredMap:
    """Type marker: a mapping of registered names to their settings (``callbacks: {lr_monitor: {}}``)."""

    registry: Any


@dataclass(frozen=True)
class Check:
    """Type marker: an extra check; ``fn(value)`` raises ValueError with a message when the value is bad."""

    fn: Callable[[Any], None]


_NOT_SET = object()


def validate(data: Any, cls: type, path: str = "") -> Any:
    """``data`` checked and converted to an instance of the dataclass ``cls``."""
    problems: list[str] = []
    result = _convert(data, cls, path, problems)
    if problems:
        raise ConfigError.many(problems)
    return result


def type_name(tp: Any) -> str:
    """A readable name for a type hint, for error messages and the docs."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *marks = get_args(tp)
        for mark in marks:
            if isinstance(mark, Registered):
                return f"mapping with 'name' (one of the {mark.registry.kind})"
            if isinstance(mark, RegisteredMap):
                return f"mapping of {mark.registry.kind} names to their settings"
        return type_name(base)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin is list:
        (item,) = get_args(tp) or (Any,)
        return f"list[{type_name(item)}]"
    if origin is dict:
        args = get_args(tp) or (str, Any)
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(value: Any, tp: Any, path: str, problems: list[str]) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Annotated:
        base, *marks = get_args(tp)
        for mark in marks:
            if isinstance(mark, Registered):
                return _convert_registered(value, mark.registry, path, problems)
            if isinstance(mark, RegisteredMap):
                return _convert_registered_map(value, mark.registry, path, problems)
        before = len(problems)
        converted = _convert(value, base, path, problems)
        for mark in marks:
            if isinstance(mark, Check) and converted is not None and len(problems) == before:  # a valid base value
                try:
                    mark.fn(converted)
                except ValueError as error:
                    problems.append(f"{path}: {error}")
        return converted
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, tp, path, problems)
    if origin in (Union, types.UnionType):
        return _convert_union(value, tp, path, problems)
    if origin is Literal:
        choices = get_args(tp)
        if value in choices and type(value) in {type(c) for c in choices}:
            return value
        hint = did_you_mean(str(value), [str(c) for c in choices])
        problems.append(f"{path}: {_describe(value)} is not one of {', '.join(repr(c) for c in choices)}{hint}")
        return value
    if origin is list:
        (item_tp,) = get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            problems.append(f"{path}: expected a list of {type_name(item_tp)}, got {_describe(value)}")
            return value
        return [_convert(v, item_tp, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping, got {_describe(value)}")
            return value
        return {k: _convert(v, value_tp, _join(path, str(k)), problems) for k, v in value.items()}
    if tp is type(None):
        if value is not None:
            problems.append(f"{path}: expected null, got {_describe(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}: expected a bool (true/false), got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an int, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a float, got {_describe(value)}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {_describe(value)}")
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            problems.append(f"{path}: expected {type_name(tp)}, got {_describe(value)}")
        return value
    raise TypeError(f"config schema: unsupported type hint {tp!r} at {path}")


def _convert_union(value: Any, tp: Any, path: str, problems: list[str]) -> Any:
    members = get_args(tp)
    if value is None:
        if type(None) in members:
            return None
        problems.append(f"{path}: expected {type_name(tp)}, got null")
        return value
    attempts = []
    for member in members:
        if member is type(None):
            continue
        trial: list[str] = []
        converted = _convert(value, member, path, trial)
        if not trial:
            return converted
        attempts.append(trial)
    # Report the most specific failure: the member that got furthest (fewest problems that are not type errors).
    if len(attempts) == 1:
        problems.extend(attempts[0])
    else:
        # A member that failed only on the value's own type (a wrong type, or a value outside a Literal) says less
        # than the union; one that got inside the value (a problem with a nested key) says more.
        def type_only(problem: str) -> bool:
            return problem.startswith(f"{path}: expected") or (problem.startswith(f"{path}: ")
                                                               and " is not one of " in problem)

        structured = [a for a in attempts if not all(type_only(p) for p in a)]
        if structured:
            problems.extend(min(structured, key=len))
        else:
            problems.append(f"{path}: expected {type_name(tp)}, got {_describe(value)}")
    return value


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _convert_dataclass(value: Any, cls: type, path: str, problems: list[str]) -> Any:
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.append(f"{path or 'config'}: expected a mapping, got {_describe(value)}")
        return None
    problems_before = len(problems)
    hints = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in value:
        if key not in fields:
            match = closest(str(key), fields)
            hint = f" (did you mean '{_join(path, match)}'?)" if match else ""
            problems.append(f"{_join(path, str(key))}: unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        key_path = _join(path, name)
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                problems.append(f"{key_path}: required key is missing (expected {type_name(hints[name])})")
            continue
        reason = unsupported_reason(f)
        if reason is not None and not is_default(f, value[name]):
            problems.append(f"{key_path}: {reason} is not supported yet (remove the key or keep its default)")
            continue
        kwargs[name] = _convert(value[name], hints[name], key_path, problems)
    try:
        section = cls(**kwargs)
    except (TypeError, ValueError) as error:
        if not problems:
            problems.append(f"{path or 'config'}: {error}")
        return None
    # A section may check how its keys fit together (e.g. d_model divisible by n_heads); only once each key
    # is valid on its own, so that one mistake is not reported twice.
    if len(problems) == problems_before and hasattr(section, "check_settings"):
        problems.extend(section.check_settings(path))
    return section


def is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return value == f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return value == f.default_factory()  # type: ignore[misc]
    return False


def _convert_registered(value: Any, registry: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping with a 'name' key, got {_describe(value)}")
        return None
    name = value.get("name")
    if not isinstance(name, str):
        problems.append(f"{_join(path, 'name')}: required; one of {', '.join(registry.names())}")
        return None
    settings = {k: v for k, v in value.items() if k != "name"}
    return _build_component(name, settings, registry, path, _join(path, "name"), problems)


def _convert_registered_map(value: Any, registry: Any, path: str, problems: list[str]) -> Any:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping of {registry.kind} names to settings, got {_describe(value)}")
        return {}
    result = {}
    for name, settings in value.items():
        component = _build_component(str(name), settings, registry, _join(path, str(name)), _join(path, str(name)),
                                     problems)
        if component is not None:
            result[str(name)] = component.settings
    return result


def _build_component(name: str, settings: Any, registry: Any, path: str, name_path: str,
                     problems: list[str]) -> Component | None:
    try:
        entry = registry.get(name, key=name_path)
    except ConfigError as error:
        problems.append(str(error))
        return None
    if entry.config is None:
        if settings not in (None, {}) and not isinstance(settings, dict):
            problems.append(f"{path}: expected a mapping, got {_describe(settings)}")
        return Component(name, settings or {})
    return Component(name, _convert_dataclass(settings or {}, entry.config, path, problems))


def to_plain(obj: Any) -> Any:
    """A validated config back as plain containers (for logging and saving next to checkpoints)."""
    if isinstance(obj, Component):
        return {"name": obj.name, **(to_plain(obj.settings) or {})}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
