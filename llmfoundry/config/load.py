"""Load a YAML recipe, apply command-line overrides as llm-foundry reads them, and resolve interpolations.

Overrides are OmegaConf dot-lists, as llm-foundry's scripts read them (``om.from_cli`` merged into the YAML):
``a.b=VALUE`` splits at the first ``=`` and VALUE is parsed as YAML, so ``seed=3`` is an int, ``max_duration=10ba``
a string, ``betas=[0.9,0.95]`` a list, ``x=null`` (or a bare ``x``) None, ``model={n_layers: 2}`` a mapping merged
into ``model``, and ``save_folder=s3://b/{run_name}/ckpt`` or ``a=b=c`` plain strings (a value that starts with
``{`` or ``[`` is YAML flow syntax: quote it, ``save_folder='{run_name}/ckpt'``). A list item is addressed by its
index (``icl_tasks.0.num_fewshot=[0]``). Hydra's prefixes work too: ``+a.b=1`` and ``++a.b=1`` set a key like
``a.b=1`` does, and ``~a.b`` deletes one (``~a.b=1`` only when its value is 1).

Overrides may set any key whether or not the YAML mentions it: judging whether a key exists is the schema's job
(llmfoundry.train.recipe), which reports unknown keys with a suggestion. ``${variables.x}`` and every other
OmegaConf interpolation are resolved here, once, after the overrides.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llmfoundry.core.errors import ConfigError, closest, first_line
from llmfoundry.core.notices import notice_once
from llmfoundry.core.secrets import find_secrets, remember

_FORMS = "key=value with a YAML value, +key=value, ++key=value or ~key"


def read_yaml(path: str | Path) -> DictConfig:
    """A YAML file as an (unresolved) DictConfig; a missing file or bad YAML is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such recipe file (give the path of a YAML file, e.g. yamls/quickstart.yaml)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        bad = error.object[error.start:error.start + 1]
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}: {bad!r}); save the recipe as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the recipe ({first_line(error)})") from None
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
        raise ConfigError(f"{path}: {first_line(error)}") from None


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """Apply command-line overrides to ``cfg`` in place, in order (a later one wins)."""
    for text in overrides:
        if text.startswith("~"):
            _delete(cfg, text)
            continue
        body = text[2:] if text.startswith("++") else text.removeprefix("+")  # Hydra's prefixes: set like key=value
        key, _, value = body.partition("=")
        _check_key(key, text)
        if value.lstrip()[:1] in ("{", "["):
            _check_flow_keys(_parse_value(text, key, value), text)
        try:
            # llm-foundry's own parsing: split at the first '=', the value read by OmegaConf's YAML loader,
            # merged into what is there (mappings merge key by key; lists and scalars are replaced)
            cfg.merge_with_dotlist([body])
        except yaml.YAMLError as error:
            raise _invalid_yaml(text, key, value, error) from None
        except (OmegaConfBaseException, ValueError, TypeError) as error:  # e.g. a list indexed by a name
            raise ConfigError(f"override '{text}': cannot set '{key}': {first_line(error)}") from None


def _check_key(key: str, text: str) -> None:
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"override '{text}': '{key}' is not a key (expected {_FORMS}, e.g. model.n_layers=2)")


def _check_flow_keys(value: Any, text: str) -> None:
    """``{n_layers:2}`` is YAML for the key 'n_layers:2' with no value (llm-foundry would take it so, silently):
    an error that says to put a space after the colon."""
    if isinstance(value, dict):
        for key, item in value.items():
            if item is None and isinstance(key, str) and ":" in key.strip(":"):
                fixed = key.replace(":", ": ", 1)
                raise ConfigError(f"override '{text}': '{key}' reads as a key with no value; put a space after the "
                                  f"colon ({fixed})")
            _check_flow_keys(item, text)
    elif isinstance(value, list):
        for item in value:
            _check_flow_keys(item, text)


def _invalid_yaml(text: str, key: str, value: str, error: yaml.YAMLError) -> ConfigError:
    problem = getattr(error, "problem", None) or first_line(error)
    return ConfigError(f"override '{text}': the value is not valid YAML ({problem}); quote it, e.g. {key}='{value}'")


def _parse_value(text: str, key: str, value: str) -> Any:
    """``value`` read the way a ``key=value`` override's value is."""
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
    except yaml.YAMLError as error:
        raise _invalid_yaml(text, key, value, error) from None


def _delete(cfg: DictConfig, text: str) -> None:
    key, has_value, value = text[1:].partition("=")
    _check_key(key, text)
    *parents, leaf = key.split(".")
    node: Any = cfg
    for part in parents:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig) or leaf not in node:
        raise ConfigError(f"override '{text}': cannot delete '{key}', the recipe does not set it")
    if has_value:
        expected, current = _parse_value(text, key, value), OmegaConf.to_container(node, resolve=False)[leaf]
        if expected != current:
            raise ConfigError(f"override '{text}': cannot delete '{key}': its value is {current!r}, not "
                              f"{expected!r} (use ~{key} to delete it whatever its value)")
    del node[leaf]


def resolve(cfg: DictConfig, source: str = "config") -> dict[str, Any]:
    """All interpolations resolved, as plain Python containers."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None)
        where = f"{key}: " if key else ""
        raise ConfigError(f"{source}: {where}cannot resolve interpolation: {first_line(error)}") from None


def load_config(path: str | Path, overrides: list[str] | None = None, schema: type | None = None) -> dict[str, Any]:
    """The recipe at ``path`` with ``overrides`` applied and every interpolation resolved.

    ``schema``: the recipe's top-level dataclass; top-level keys it does not have are then read as llm-foundry's
    (deprecated) top-level variables where that is what they are (see :func:`adopt_top_level_variables`)."""
    cfg = read_yaml(path)
    apply_overrides(cfg, list(overrides or []))
    referenced = interpolated_names(cfg)
    plain = resolve(cfg, source=str(path))
    remember(find_secrets(plain))  # masked in every message that quotes them from now on
    if schema is not None:
        adopt_top_level_variables(plain, schema, referenced)
    return plain


_INTERPOLATION = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)")


def interpolated_names(cfg: DictConfig) -> set[str]:
    """The first name of every ``${name...}`` interpolation in ``cfg``'s values (top-level keys they read)."""
    names: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, str):
            names.update(_INTERPOLATION.findall(value))

    visit(OmegaConf.to_container(cfg, resolve=False))
    return names


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _takes_a_section(hint: Any) -> bool:
    """Whether a schema field holds a section (a settings dataclass or a dict), possibly optional."""
    options = (hint, *typing.get_args(hint))
    return any(dataclasses.is_dataclass(o) or o is dict or typing.get_origin(o) is dict for o in options)


def adopt_top_level_variables(plain: dict[str, Any], schema: type, referenced: set[str]) -> list[str]:
    """Move llm-foundry's top-level variables (``data_local: ...`` used as ``${data_local}``) under ``variables``,
    as llm-foundry does (with a deprecation warning), and say so once; returns the moved keys.

    llm-foundry moves every unknown top-level key; here only a key that an interpolation reads, or one that is not
    close to any key of the schema, is moved: a near miss such as ``max_duraton`` stays an error with a suggestion."""
    known = {f.name for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)

    def is_variable(key: str) -> bool:
        near = closest(key, known)
        # a plain value next to a section's name (model_name: gpt2 beside model: {...}) is no misspelt section
        return key in referenced or near is None or (_is_scalar(plain[key]) and _takes_a_section(hints.get(near)))

    moved = [key for key in list(plain) if key not in known and is_variable(key)]
    if not moved:
        return []
    variables = plain.setdefault("variables", {})
    if not isinstance(variables, dict):
        return []  # the validator reports the malformed variables section
    for key in moved:
        variables.setdefault(key, plain.pop(key))
    notice_once(f"{', '.join(moved)}: read as variables (llm-foundry's top-level variables are deprecated; put them "
                "under `variables:`)")
    return moved
