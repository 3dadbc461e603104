"""Named builders: the one place that maps a name in a YAML recipe to the code that builds it.

Each kind of component (models, dataloaders, optimizers, ...) has a ``Registry``. A builder is known by its name
with the dataclass that describes its config section, so that the config schema can validate the section before
anything is built. The built-in builders are *declared* by light catalog modules (one per kind, see
``provider_modules`` below) as ``"module:function"`` strings next to their settings dataclasses, so that checking a
recipe imports neither torch nor transformers; the builder's module is imported when the component is built::

    models.declare("mpt_causal_lm", "llmfoundry.models.mpt_causal_lm:build_mpt", config=MPTModelSettings)

Plugins register the builder itself (``code_paths`` files, or entry points in the group ``llmfoundry.<kind>``,
e.g. ``llmfoundry.models``, naming a builder or a module that registers on import)::

    @models.register("my_model", config=MyModelSettings)
    def build_my_model(settings: MyModelSettings, tokenizer) -> nn.Module: ...
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from llmfoundry.core.errors import ConfigError, did_you_mean


def resolve(reference: str) -> Any:
    """The object a ``"package.module:attribute"`` reference names, its module imported now (how catalogs and the
    command tables name code that is loaded only when it runs)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def lazy_attributes(package: str, references: dict[str, str]):
    """A module ``__getattr__`` for ``package`` that imports each attribute's ``"module:attribute"`` reference on
    first use (a light package re-exporting a class whose module needs torch)."""

    def __getattr__(attribute: str) -> Any:
        if attribute in references:
            return resolve(references[attribute])
        raise AttributeError(f"module {package!r} has no attribute {attribute!r}")

    return __getattr__


@dataclass(frozen=True)
class Entry:
    name: str
    target: Callable[..., Any] | str  # the builder, or "module:function" naming it (imported when first built)
    config: type | None  # a dataclass describing the builder's config section (without its `name` key)
    differs: str | None = None  # how this name behaves differently from llm-foundry (shown by `llmfoundry check`)

    @property
    def builder(self) -> Callable[..., Any]:
        """The builder; a declared one is imported here, when something is built, not when a recipe is checked."""
        return self.target if not isinstance(self.target, str) else resolve(self.target)


class Registry:
    """A name -> builder table for one kind of component."""

    def __init__(self, kind: str, *, provider_modules: tuple[str, ...] = ()):
        self.kind = kind
        # Modules whose import registers the built-in builders; imported on first lookup so that importing
        # the registry stays cheap and free of cycles.
        self._provider_modules = provider_modules
        self._entries: dict[str, Entry] = {}
        self._refused: dict[str, str] = {}  # names llm-foundry registers that cannot exist here -> why
        self._loaded = False

    def register(self, name: str, *, config: type | None = None,
                 differs: str | None = None) -> Callable[[Callable], Callable]:
        def decorator(builder: Callable) -> Callable:
            existing = self._entries.get(name)
            if existing is not None and existing.target is not builder:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, builder, config, differs)
            return builder

        return decorator

    def declare(self, name: str, builder: str, *, config: type | None = None, differs: str | None = None) -> None:
        """Make ``name`` known with its settings now and its builder (``"package.module:function"``) imported when
        it is first built: how the built-in components are listed, so that validation stays free of torch."""
        module, colon, attribute = builder.partition(":")
        if not (module and colon and attribute.isidentifier()):
            raise ValueError(f"{self.kind} '{name}': builder {builder!r} is not 'package.module:function'")
        existing = self._entries.get(name)
        if existing is not None and existing.target != builder:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = Entry(name, builder, config, differs)

    def refuse(self, name: str, why: str) -> None:
        """Make ``name`` (registered by llm-foundry, impossible here) a one-line error saying ``why`` when used."""
        self._refused[name] = why

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._provider_modules:
            importlib.import_module(module)
        for entry_point in entry_points(group=f"llmfoundry.{self.kind}"):
            loaded = entry_point.load()
            if callable(loaded) and entry_point.name not in self._entries:
                self.register(entry_point.name)(loaded)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._load()
        return isinstance(name, str) and name in self._entries

    def get(self, name: str, *, key: str | None = None) -> Entry:
        """The entry for ``name``; an unknown name is a ConfigError that lists the valid names.

        ``key`` is the config path that held the name (e.g. ``model.name``), used in the message.
        """
        self._load()
        if not isinstance(name, str):  # e.g. a list or a mapping where a recipe needs one name
            raise ConfigError(f"{key + ': ' if key else ''}expected the name of a {self.kind[:-1]} (one of "
                              f"{', '.join(self.names())}), got {type(name).__name__} {name!r:.40}")
        if name in self._refused and name not in self._entries:
            raise ConfigError(f"{key + ': ' if key else ''}{self.kind[:-1]} '{name}' is not available here: "
                              f"{self._refused[name]}")
        if name not in self._entries:
            where = f"{key}: " if key else ""
            valid = ", ".join(self.names()) or "(none registered)"
            raise ConfigError(
                f"{where}unknown {self.kind} '{name}'{did_you_mean(str(name), self._entries)}; valid names: {valid}"
            )
        return self._entries[name]


# Each kind's provider is a light catalog module (declarations + settings dataclasses; no torch, transformers or
# streaming), except where only building consults the registry (tokenizers, preprocessors).
models = Registry("models", provider_modules=("llmfoundry.models.catalog",))
tokenizers = Registry("tokenizers", provider_modules=("llmfoundry.data.tokenizers",))
dataloaders = Registry("dataloaders", provider_modules=("llmfoundry.data.catalog",))
optimizers = Registry("optimizers", provider_modules=("llmfoundry.train.catalog",))
schedulers = Registry("schedulers", provider_modules=("llmfoundry.train.schedules",))
algorithms = Registry("algorithms", provider_modules=("llmfoundry.train.catalog",))
callbacks = Registry("callbacks", provider_modules=("llmfoundry.train.callbacks.catalog",))
loggers = Registry("loggers", provider_modules=("llmfoundry.train.loggers.catalog",))
icl_task_types = Registry("icl_task_types", provider_modules=("llmfoundry.eval.icl",))
metrics = Registry("metrics", provider_modules=("llmfoundry.eval.icl",))
# finetuning record formatters, by name or by the hf_name they format (llm-foundry's dataset_constructor.register)
preprocessors = Registry("preprocessors", provider_modules=("llmfoundry.data.preprocessors",))


def import_code_paths(paths: list[str] | None, key: str = "code_paths") -> None:
    """Import the Python files a recipe names in ``code_paths`` (llm-foundry's key), so that the builders they
    register are known before the recipe is validated. Each file is imported once per process."""
    if paths is None:
        return
    if isinstance(paths, str) or not isinstance(paths, list):
        raise ConfigError(f"{key}: expected a list of Python file paths, got {paths!r}")
    for i, path in enumerate(paths):
        file = Path(str(path)).resolve()
        if file.suffix != ".py" or not file.is_file():
            raise ConfigError(f"{key}[{i}]: '{path}' is not a Python file")
        name = f"llmfoundry_code_paths.{file.stem}_{abs(hash(str(file))):x}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[name]
            raise ConfigError(f"{key}[{i}]: importing '{path}' failed ({type(error).__name__}: {error})") from None
