"""MPT: the architecture's config and the model (the `mpt_causal_lm` builder is llmfoundry.models.mpt_causal_lm)."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from llmfoundry.models.mpt.config import MPTArch, MPTConfig, MPTModelSettings
from llmfoundry.models.mpt.model import MPTForCausalLM

__all__ = ["MPTArch", "MPTConfig", "MPTForCausalLM", "MPTModelSettings"]


def _register_auto_classes() -> None:
    """Let AutoConfig / AutoModelForCausalLM open our own save_pretrained folders in this process."""
    try:
        AutoConfig.register(MPTConfig.model_type, MPTConfig)
        AutoModelForCausalLM.register(MPTConfig, MPTForCausalLM)
    except ValueError:  # already registered (module reloaded)
        pass


_register_auto_classes()
