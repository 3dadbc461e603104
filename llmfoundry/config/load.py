"""Load a YAML recipe, apply command-line overrides in Hydra's grammar, and resolve interpolations.

Overrides (``a.b=1``, ``+new=2``, ``++force=3``, ``~drop``) may set any key whether or not the YAML mentions it:
judging whether a key exists is the schema's job (llmfoundry.train.recipe), which reports unknown keys with a
suggestion. ``${variables.x}`` and every other OmegaConf interpolation are resolved here, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llmfoundry.core.errors import ConfigError, first_line


def read_yaml(path: str | Path) -> DictConfig:
    """A YAML file as an (unresolved) DictConfig; a missing file or bad YAML is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such recipe file (give the path of a YAML file, e.g. yamls/quickstart.yaml)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or first_line(error)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys to values, got {type(data).__name__}")
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path}: {error}") from None


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """Apply Hydra-grammar overrides to ``cfg`` in place."""
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException as error:
            grammar = "expected key=value, +key=value or ~key"
            raise ConfigError(f"override '{text}': {first_line(error)} ({grammar})") from None
        key = override.key_or_group
        if override.package:
            raise ConfigError(f"override '{text}': '@package' overrides are not supported")
        if override.is_delete():
            _delete(cfg, key, text)
            continue
        value = override.value()
        if isinstance(value, (dict, list)):
            value = OmegaConf.create(value)
        try:
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
        except OmegaConfBaseException as error:
            raise ConfigError(f"override '{text}': {first_line(error)}") from None


def _delete(cfg: DictConfig, key: str, text: str) -> None:
    *parents, leaf = key.split(".")
    node: Any = cfg
    for part in parents:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig) or leaf not in node:
        raise ConfigError(f"override '{text}': cannot delete '{key}', the recipe does not set it")
    del node[leaf]


def resolve(cfg: DictConfig, source: str = "config") -> dict[str, Any]:
    """All interpolations resolved, as plain Python containers."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None)
        where = f"{key}: " if key else ""
        raise ConfigError(f"{source}: {where}cannot resolve interpolation: {first_line(error)}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The recipe at ``path`` with ``overrides`` applied and every interpolation resolved."""
    cfg = read_yaml(path)
    apply_overrides(cfg, list(overrides or []))
    return resolve(cfg, source=str(path))
