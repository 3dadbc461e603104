"""The generated config reference is complete and current; the guides link to files that exist."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from llmfoundry.commands import docs

REPO = Path(__file__).resolve().parents[2]


def _schema_key_paths() -> set[str]:
    """Every key path the schema accepts, found by walking the dataclasses directly (independently of docs.py)."""
    from llmfoundry import registry
    from llmfoundry.eval.config import EvalConfig, GauntletConfig, ICLTaskConfig
    from llmfoundry.train.recipe import TrainConfig

    paths: set[str] = set()

    def sections_in(tp):
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            yield "", tp
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            if any(isinstance(m, (docs.Registered, docs.RegisteredMap)) for m in args[1:]):
                return
            yield from sections_in(args[0])
        elif origin is list:
            for arg in args:
                yield from (("[]" + s, c) for s, c in sections_in(arg))
        elif origin is dict and len(args) == 2:
            yield from ((".<name>" + s, c) for s, c in sections_in(args[1]))
        elif args and origin is not typing.Literal:
            for arg in args:
                yield from sections_in(arg)

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            paths.add(prefix + f.name)
            for suffix, nested in sections_in(hints[f.name]):
                walk(nested, f"{prefix}{f.name}{suffix}.")

    walk(TrainConfig, "")
    walk(EvalConfig, "")
    walk(ICLTaskConfig, "icl_tasks[].")
    walk(GauntletConfig, "eval_gauntlet.")
    for kind, key, _ in docs.SECTIONS:
        reg = getattr(registry, kind)
        for name in reg.names():
            entry = reg.get(name)
            if entry.config is not None and entry.builder.__module__.startswith("llmfoundry."):
                walk(entry.config, f"{key}.{name}." if key in ("algorithms", "callbacks", "loggers") else f"{key}.")
    return paths


def test_config_reference_lists_every_key_the_schema_accepts():
    text = (REPO / "docs/config-reference.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    missing = sorted(_schema_key_paths() - listed)
    assert not missing, f"keys missing from docs/config-reference.md (run python -m llmfoundry.commands.docs): {missing}"


def test_every_key_has_a_doc():
    assert docs.undocumented_keys() == []


def test_generated_docs_are_current():
    assert (REPO / "docs/config-reference.md").read_text() == docs.render_reference(), (
        "docs/config-reference.md is stale: run python -m llmfoundry.commands.docs"
    )
    migrating = (REPO / "docs/migrating-from-llm-foundry.md").read_text()
    assert docs.render_unsupported_block() in migrating, "the not-supported list is stale: run python -m llmfoundry.commands.docs"
    assert docs.main(["--check"]) == 0


def test_a_new_undocumented_key_fails_the_check(monkeypatch):
    from llmfoundry.config.fields import option
    from llmfoundry.data.loader_settings import TextLoaderSettings

    @dataclasses.dataclass
    class WithNewKey(TextLoaderSettings):
        brand_new: int = option(3)  # no doc

    entry = docs._builtin_entries
    monkeypatch.setattr(docs, "_builtin_entries", lambda kind: (
        [(n, dataclasses.replace(e, config=WithNewKey)) if n == "text" else (n, e) for n, e in entry(kind)]
        if kind == "dataloaders" else entry(kind)))  # fmt: skip
    assert "train_loader.brand_new" in docs.undocumented_keys()
    assert "`train_loader.brand_new`" in docs.render_reference()
    assert docs.main(["--check"]) == 1


def test_unsupported_keys_are_listed_as_such():
    text = (REPO / "docs/config-reference.md").read_text()
    for path, _, _ in docs.unsupported_keys():
        rows = [line for line in text.splitlines() if line.startswith(f"| `{path}` |")]
        assert any("not supported yet" in row for row in rows), path


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_guides_name_only_files_and_recipes_that_exist(page):
    text = (REPO / "docs" / page).read_text()
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in link:
            assert (REPO / "docs" / link).exists(), f"{page}: broken link {link}"
    for path in re.findall(r"\b((?:yamls|eval/yamls|data_prep|scripts)/[\w./-]+\.(?:yaml|py|sh))\b", text):
        assert (REPO / path).exists(), f"{page}: names {path}, which does not exist"
