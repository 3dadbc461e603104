"""Generate docs/config-reference.md (every key of every recipe section) from the schema itself.

    python -m llmfoundry.commands.docs            # rewrite the generated docs
    python -m llmfoundry.commands.docs --check    # exit 1 when they are stale or a key has no doc

The reference walks ``TrainConfig`` and the config dataclass of every built-in registered builder (models, data
loaders, optimizers, ...), recursively through nested sections, lists and mappings of sections, and the eval
recipe (``EvalConfig``). Each key is listed with its type (``validate.type_name``), its default and the ``doc`` of
its ``option``. Keys declared with ``unsupported=`` are listed as such here, and their list is also written into
the generated block of docs/migrating-from-llm-foundry.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from llmfoundry import registry
from llmfoundry.config.fields import doc_of, unsupported_reason
from llmfoundry.config.validate import Registered, RegisteredMap, type_name
from llmfoundry.eval.config import EvalConfig, GauntletConfig, ICLTaskConfig
from llmfoundry.train.recipe import TrainConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
REFERENCE = DOCS / "config-reference.md"
MIGRATING = DOCS / "migrating-from-llm-foundry.md"
BEGIN = "<!-- BEGIN GENERATED: not supported yet (python -m llmfoundry.commands.docs) -->"
END = "<!-- END GENERATED -->"

# registries whose builders' sections appear in a training recipe, in the order of the reference
SECTIONS = [
    ("models", "model", "`model.name`"),
    ("dataloaders", "train_loader", "`train_loader.name` / `eval_loader.name`"),
    ("optimizers", "optimizer", "`optimizer.name`"),
    ("schedulers", "scheduler", "`scheduler.name`"),
    ("algorithms", "algorithms", "a key of `algorithms`"),
    ("callbacks", "callbacks", "a key of `callbacks`"),
    ("loggers", "loggers", "a key of `loggers`"),
]


@dataclass
class Key:
    path: str
    type: str
    default: str
    doc: str
    unsupported: str | None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _nested_dataclasses(tp: Any, suffix: str = "") -> list[tuple[str, type]]:
    """(path suffix, dataclass) for every section type inside a type hint (``x``, ``x[]``, ``x.<name>``)."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *marks = get_args(tp)
        if any(isinstance(m, (Registered, RegisteredMap)) for m in marks):
            return []  # documented per registered name
        return _nested_dataclasses(base, suffix)
    if dataclasses.is_dataclass(tp):
        return [(suffix, tp)]
    if origin in (Union, types.UnionType):
        return [found for arg in get_args(tp) for found in _nested_dataclasses(arg, suffix)]
    if origin is list:
        return [found for arg in get_args(tp) for found in _nested_dataclasses(arg, suffix + "[]")]
    if origin is dict:
        args = get_args(tp)
        return _nested_dataclasses(args[1], suffix + ".<name>") if len(args) == 2 else []
    return []


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value) if (value == "" or value.strip() != value) else value
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def keys_of(cls: type, prefix: str = "") -> list[Key]:
    """Every key of section ``cls`` (recursively), with ``prefix`` before each path."""
    out: list[Key] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        out.append(Key(path, type_name(tp), _default(f), doc_of(f), unsupported_reason(f)))
        for suffix, nested in _nested_dataclasses(tp):
            out += keys_of(nested, f"{path}{suffix}.")
    return out


def _builtin_entries(kind: str):
    reg = getattr(registry, kind)
    for name in reg.names():
        entry = reg.get(name)
        # a built-in is declared by its catalog as "llmfoundry....:function" (a plugin's builder is not ours)
        module = entry.target if isinstance(entry.target, str) else entry.target.__module__
        if module.startswith("llmfoundry."):
            yield name, entry


def all_sections() -> list[tuple[str, str, list[Key]]]:
    """(heading, intro, keys) for every part of the reference."""
    parts = [("Training recipe (top level)", "The keys of a recipe for `llmfoundry train` (`TrainConfig`). "
              "Sections chosen by `name` are listed further down, per name.", keys_of(TrainConfig))]  # fmt: skip
    for kind, key, how in SECTIONS:
        for name, entry in _builtin_entries(kind):
            if entry.config is None:
                keys: list[Key] = []
                intro = f"Chosen with {how} = `{name}`. No settings."
            else:
                keys = keys_of(entry.config, f"{key}.")
                intro = f"Chosen with {how} = `{name}`."
            if kind in ("algorithms", "callbacks", "loggers"):
                keys = [dataclasses.replace(k, path=k.path.replace(f"{key}.", f"{key}.{name}.", 1)) for k in keys]
            parts.append((f"`{kind}`: `{name}`", intro, keys))
    parts.append(("Eval recipe (`llmfoundry eval`)", "The keys of an eval recipe (`EvalConfig`).", keys_of(EvalConfig)))
    parts.append(("ICL task (an entry of `icl_tasks`)", "Also the shape of each task in a task-list YAML file.",
                  keys_of(ICLTaskConfig, "icl_tasks[].")))  # fmt: skip
    parts.append(("Eval gauntlet (`eval_gauntlet`)", "Inline or in a gauntlet YAML file.",
                  keys_of(GauntletConfig, "eval_gauntlet.")))  # fmt: skip
    return parts


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m llmfoundry.commands.docs` from the schema; do not edit by hand. -->",
        "",
        "Every key a recipe may set, with its type, default and meaning. Paths are dotted; `[]` is an entry of a",
        "list and `<name>` a key of your choosing. A key marked **not supported yet** is accepted while it keeps",
        "its default and is an error when set. Unknown keys are errors that suggest the closest valid key.",
        "",
        "## Contents",
        "",
    ]
    parts = all_sections()
    for heading, _, _ in parts:
        anchor = "".join(c for c in heading.lower().replace(" ", "-") if c.isalnum() or c in "-_")
        lines.append(f"- [{heading}](#{anchor})")
    for heading, intro, keys in parts:
        lines += ["", f"## {heading}", "", intro, ""]
        if not keys:
            continue
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for k in keys:
            meaning = k.doc + (f" — **not supported yet** ({k.unsupported})" if k.unsupported else "")
            lines.append(f"| `{k.path}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def unsupported_keys() -> list[tuple[str, str, str]]:
    """(key path, where it is used, what it is) for every key marked ``unsupported=``."""
    seen: dict[tuple[str, str], str] = {}
    for heading, _, keys in all_sections():
        where = "eval recipe" if heading.startswith(("Eval", "ICL")) else "training recipe"
        for k in keys:
            if k.unsupported and (k.path, where) not in seen:
                seen[(k.path, where)] = k.unsupported
    return sorted((path, where, reason) for (path, where), reason in seen.items())


def render_unsupported_block() -> str:
    lines = [BEGIN, "", "| key | in | what it is |", "| --- | --- | --- |"]
    lines += [f"| `{path}` | {where} | {_cell(reason)} |" for path, where, reason in unsupported_keys()]
    return "\n".join(lines + ["", END])


def undocumented_keys() -> list[str]:
    return [k.path for _, _, keys in all_sections() for k in keys if not k.doc.strip()]


def _with_block(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{MIGRATING}: the markers {BEGIN!r} ... {END!r} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + render_unsupported_block() + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmfoundry.commands.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the generated docs are stale")
    args = parser.parse_args(argv)
    missing = undocumented_keys()
    if missing:
        print("keys without a doc (give their option a doc=...):\n  " + "\n  ".join(missing), file=sys.stderr)
        if args.check:
            return 1
    targets = {REFERENCE: render_reference(), MIGRATING: _with_block(MIGRATING.read_text())}
    stale = [path for path, text in targets.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m llmfoundry.commands.docs", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(targets[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
