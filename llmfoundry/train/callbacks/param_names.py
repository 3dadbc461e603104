"""Parameter names as llm-foundry (Composer's model wrappers) writes them, and back.

Composer wraps the model as ``model``, so llm-foundry's names are ``model.`` + the model's own; this project's
hf_causal_lm keeps the transformers model under ``hf_model.``.
"""

from __future__ import annotations

HF_PREFIX = "hf_model."


def composer_name(name: str) -> str:
    """A parameter's name as Composer's model wrappers give it (``model.transformer...``)."""
    return "model." + name.removeprefix(HF_PREFIX)


def our_name(name: str, names: set[str]) -> str:
    """The parameter named ``name`` in Composer's terms (``model.`` prefix) or ours, as it is named in the model."""
    if name in names:
        return name
    rest = name.removeprefix("model.")
    return next((candidate for candidate in (rest, HF_PREFIX + rest) if candidate in names), name)
