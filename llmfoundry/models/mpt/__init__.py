"""MPT: config, model and the `mpt_causal_lm` builder."""

from __future__ import annotations

import dataclasses

from llmfoundry.config.errors import ConfigError
from llmfoundry.models.mpt.config import MPTArch, MPTConfig, MPTModelSettings
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.registry import models

__all__ = ["MPTArch", "MPTConfig", "MPTForCausalLM", "MPTModelSettings", "build_mpt"]

# Options that may differ from a pretrained folder's config: they change how the network runs, not what it is.
RUNTIME_KEYS = ("init_device", "resid_pdrop", "emb_pdrop", "use_cache")
RUNTIME_ATTN_KEYS = ("attn_impl", "attn_pdrop")


@models.register("mpt_causal_lm", config=MPTModelSettings)
def build_mpt(settings: MPTModelSettings, tokenizer) -> MPTForCausalLM:
    fields = {f.name for f in dataclasses.fields(MPTArch)}
    arch = MPTArch(**{k: getattr(settings, k) for k in fields})
    if settings.pretrained_model_name_or_path:
        from llmfoundry.models.convert import load_as_mpt

        model = load_as_mpt(
            settings.pretrained_model_name_or_path,
            overrides={k: getattr(arch, k) for k in RUNTIME_KEYS},
            attn_overrides={k: getattr(arch.attn_config, k) for k in RUNTIME_ATTN_KEYS},
        )
    else:
        arch.validate()
        model = MPTForCausalLM(MPTConfig.from_arch(arch))
    vocab = model.arch.vocab_size
    if tokenizer is not None and len(tokenizer) > vocab:
        raise ConfigError(
            f"model.vocab_size: {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens "
            f"(set model.vocab_size to at least {len(tokenizer)}; a multiple of 64 is fastest)"
        )
    return model


def _register_auto_classes() -> None:
    """Let AutoConfig / AutoModelForCausalLM open our own save_pretrained folders in this process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        AutoConfig.register(MPTConfig.model_type, MPTConfig)
        AutoModelForCausalLM.register(MPTConfig, MPTForCausalLM)
    except ValueError:  # already registered (module reloaded)
        pass


_register_auto_classes()
