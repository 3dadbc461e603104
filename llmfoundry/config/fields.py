"""How config dataclasses declare their keys: type, default, one-line doc, and whether it is honoured yet.

Every config section that a user can write in YAML is a plain ``@dataclass`` whose fields use ``option``::

    @dataclass
    class AttnConfig:
        attn_impl: Literal["torch", "sdpa", "flash"] = option("sdpa", "attention kernel: torch (reference), ...")
        kv_n_heads: int | None = option(None, "key/value heads for grouped_query_attention")
        sliding_window_size: int = option(-1, "...", unsupported="sliding-window attention")

The schema validator (llmfoundry.train.recipe) reads the type hints and defaults; the docs reference
(docs/config-reference.md) is generated from ``doc``. A field marked ``unsupported`` is accepted while it keeps
its default and is a "not supported yet" error when a user sets it, so that no key is ever silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_MISSING = dataclasses.MISSING


def option(
    default: Any = _MISSING,
    doc: str = "",
    *,
    default_factory: Any = _MISSING,
    unsupported: str | None = None,
    differs: str | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field with the metadata the validator and the docs generator read.

    ``unsupported``: a short description of the feature, for the "not supported yet" error.
    ``differs``: what this key does here that differs from llm-foundry, shown by ``llmfoundry check`` when a recipe
    sets the key (a key that behaves as in llm-foundry has none).
    ``secret``: the value is masked when the config is logged.
    """
    metadata = {"doc": doc, "unsupported": unsupported, "differs": differs, "secret": secret}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    if default is _MISSING:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def doc_of(f: dataclasses.Field) -> str:
    return f.metadata.get("doc", "") if f.metadata else ""


def unsupported_reason(f: dataclasses.Field) -> str | None:
    return f.metadata.get("unsupported") if f.metadata else None


def difference(f: dataclasses.Field) -> str | None:
    return f.metadata.get("differs") if f.metadata else None
