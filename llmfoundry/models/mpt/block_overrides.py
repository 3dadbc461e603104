"""``model.block_overrides``: llm-foundry's per-layer attention overrides, expanded to one override per layer.

Two shapes, as llm-foundry has had both::

    block_overrides:                         block_overrides:
      start: [{name: default, repeat: 1}]      order:
      repeating_pattern:                       - name: default
      - {name: local, repeat: 2}               - repeat: 2
      - {name: default, repeat: 1}               order: [{name: local}, {name: local, repeat: 2}]
      end: []                                overrides:
      overrides:                               local: {attn_config: {sliding_window_size: 1024}}
        local: {attn_config: {sliding_window_size: 1024}}

``repeating_pattern`` is repeated to fill the layers between ``start`` and ``end``; ``order`` lists every layer
(``repeat`` defaults to 1 there and nests). ``default`` names a layer without overrides. Only
``attn_config.sliding_window_size`` can be overridden here; llm-foundry's other override,
``attn_config.reuse_kv_layer_idx``, is refused (see ``check_block_overrides``).
"""

from __future__ import annotations

from typing import Any

OVERRIDABLE = ("sliding_window_size",)


def _expand_order(items: Any, path: str) -> list[str]:
    if not isinstance(items, list):
        raise ValueError(f"{path}: a list of {{name, repeat}} or {{order, repeat}} entries, got {items!r}")
    names: list[str] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if not isinstance(item, dict) or ("name" in item) == ("order" in item):
            raise ValueError(f"{where}: a mapping with either name or order, got {item!r}")
        repeat = item.get("repeat", 1)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 0:
            raise ValueError(f"{where}.repeat: a non-negative integer, got {repeat!r}")
        inner = [item["name"]] if "name" in item else _expand_order(item["order"], f"{where}.order")
        names += inner * repeat
    return names


def _expand_runs(items: Any, path: str) -> list[str]:
    if not isinstance(items, list):
        raise ValueError(f"{path}: a list of {{name, repeat}} entries, got {items!r}")
    names: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"name", "repeat"}:
            raise ValueError(f"{path}[{i}]: a mapping with name and repeat, got {item!r}")
        if not isinstance(item["repeat"], int) or isinstance(item["repeat"], bool) or item["repeat"] < 0:
            raise ValueError(f"{path}[{i}].repeat: a non-negative integer, got {item['repeat']!r}")
        names += [item["name"]] * item["repeat"]
    return names


def layer_names(spec: dict[str, Any], n_layers: int, path: str = "model.block_overrides") -> list[str]:
    """The override name of each layer; ValueError (naming the key) when the spec is malformed."""
    unknown = set(spec) - {"order", "start", "repeating_pattern", "end", "overrides"}
    if unknown:
        raise ValueError(f"{path}.{sorted(unknown)[0]}: unknown key (expected order or start/repeating_pattern/end, "
                         "and overrides)")
    if "order" in spec:
        if {"start", "repeating_pattern", "end"} & set(spec):
            raise ValueError(f"{path}: use either order or start/repeating_pattern/end, not both")
        names = _expand_order(spec["order"], f"{path}.order")
    elif {"start", "repeating_pattern", "end"} & set(spec):
        start = _expand_runs(spec.get("start", []), f"{path}.start")
        end = _expand_runs(spec.get("end", []), f"{path}.end")
        pattern = _expand_runs(spec.get("repeating_pattern", []), f"{path}.repeating_pattern")
        middle = n_layers - len(start) - len(end)
        if pattern:
            if middle < 0 or middle % len(pattern):
                raise ValueError(f"{path}.repeating_pattern: {len(pattern)} layers do not fill the {middle} layers "
                                 f"between start and end (n_layers={n_layers})")
            pattern = pattern * (middle // len(pattern))
        names = start + pattern + end
    else:
        raise ValueError(f"{path}: needs order, or start / repeating_pattern / end")
    if len(names) != n_layers:
        raise ValueError(f"{path}: describes {len(names)} layers, but n_layers is {n_layers}")
    return names


def check_block_overrides(spec: Any, n_layers: int, path: str = "model.block_overrides") -> list[str]:
    """Every problem of a block_overrides mapping, one line each."""
    if not isinstance(spec, dict):
        return [f"{path}: a mapping with order (or start/repeating_pattern/end) and overrides, got {spec!r}"]
    try:
        names = layer_names(spec, n_layers, path)
    except ValueError as error:
        return [str(error)]
    overrides = spec.get("overrides")
    if not isinstance(overrides, dict):
        return [f"{path}.overrides: a mapping of override names to {{attn_config: {{...}}}}, got {overrides!r}"]
    problems = []
    if "default" in overrides:
        problems.append(f"{path}.overrides.default: 'default' means a layer without overrides; rename it")
    for name in sorted(set(names) - set(overrides) - {"default"}):
        problems.append(f"{path}: layer name '{name}' has no entry in {path}.overrides")
    for name, override in overrides.items():
        where = f"{path}.overrides.{name}"
        if not isinstance(override, dict) or set(override) - {"attn_config"}:
            problems.append(f"{where}: only attn_config can be overridden, got {override!r}")
            continue
        for key, value in (override.get("attn_config") or {}).items():
            if key == "reuse_kv_layer_idx":
                problems.append(f"{where}.attn_config.reuse_kv_layer_idx: reusing another layer's keys and values "
                                "is not supported: the keys would leave their block outside its inputs and outputs, "
                                "which per-block sharding and activation checkpointing do not track; remove it")
            elif key not in OVERRIDABLE:
                problems.append(f"{where}.attn_config.{key}: cannot be overridden per layer (only "
                                f"{', '.join(OVERRIDABLE)})")
            elif not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
                problems.append(f"{where}.attn_config.{key}: -1 (off) or a positive window, got {value!r}")
    return problems


def layer_attn_overrides(spec: dict[str, Any] | None, n_layers: int) -> list[dict[str, Any]]:
    """The attn_config overrides of each layer (empty for default layers) of a valid spec."""
    if not spec:
        return [{} for _ in range(n_layers)]
    overrides = spec["overrides"]
    return [dict((overrides.get(name) or {}).get("attn_config") or {}) if name != "default" else {}
            for name in layer_names(spec, n_layers)]
