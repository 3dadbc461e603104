"""``MPTConfig``: the transformers config of ``MPTForCausalLM``.

It holds the values of ``MPTArch`` (models/mpt/arch.py, the typed options and their checks) as plain attributes,
nested sections as dicts, so that ``config.json`` stays readable and llm-foundry-like, for transformers'
save_pretrained / from_pretrained / generate machinery. A config.json read by from_pretrained is validated by the
recipes' schema validator (config/validate.py, against ``MPTArch``); a recipe's architecture, validated by the same
validator, is only copied in (``MPTConfig.from_arch``).
"""

from __future__ import annotations

import warnings
from typing import Any

from transformers import PretrainedConfig

from llmfoundry.config.validate import validate
from llmfoundry.models.mpt.arch import ARCH_KEYS, MPTArch, to_dict


class MPTConfig(PretrainedConfig):
    """transformers config for ``MPTForCausalLM``; its keys are exactly ``MPTArch``'s fields."""

    model_type = "llmfoundry_mpt"
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}

    def __init__(self, **kwargs: Any):
        """Parse and validate untyped values: a config.json read by from_pretrained, or MPTConfig(d_model=...)."""
        arch_values = {k: kwargs.pop(k) for k in list(kwargs) if k in ARCH_KEYS}
        kwargs.pop("verbose", None)  # an older llm-foundry key that never changed the network
        self._adopt(_parse_arch(arch_values), kwargs)

    @classmethod
    def from_arch(cls, arch: MPTArch, **kwargs: Any) -> "MPTConfig":
        """The config of an architecture that is already valid (the recipe schema checked it): its values are
        copied into attributes for transformers, and nothing is parsed or validated again."""
        config = cls.__new__(cls)
        config._adopt(arch, kwargs)
        return config

    def _adopt(self, arch: MPTArch, kwargs: dict[str, Any]) -> None:
        self._arch = arch
        for key, value in to_dict(arch).items():
            if key != "tie_word_embeddings":  # a PretrainedConfig argument of its own
                setattr(self, key, value)
        super().__init__(tie_word_embeddings=arch.tie_word_embeddings, **kwargs)

    def arch(self) -> MPTArch:
        """The typed architecture this config was made from. Attributes assigned since then (hf_causal_lm's
        config_overrides do that) are new values, so they are parsed and validated here, once."""
        values = {k: getattr(self, k) for k in ARCH_KEYS}
        if values != to_dict(self._arch):
            self._arch = _parse_arch(values)
        return self._arch

    def to_dict(self) -> dict[str, Any]:
        values = super().to_dict()
        del values["_arch"]  # the typed form of the attributes above, not a key of its own
        return values


def _parse_arch(values: dict[str, Any]) -> MPTArch:
    return validate(values, MPTArch, "model")


def resolve_attn_impl(impl: str) -> str:
    """``flash`` means flash-attn when it is installed; otherwise SDPA (which uses flash kernels on GPUs anyway)."""
    if impl != "flash":
        return impl
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        if not getattr(resolve_attn_impl, "_warned", False):
            warnings.warn("attn_impl=flash: flash-attn is not installed; using torch SDPA instead", stacklevel=2)
            resolve_attn_impl._warned = True
        return "sdpa"
    return "flash"
