"""Model builders. Importing this package registers `mpt_causal_lm` and `hf_causal_lm` in llmfoundry.registry."""

from llmfoundry.models import hf, mpt_causal_lm  # noqa: F401  (each registers its builder on import)
from llmfoundry.models.hf import HFCausalLM, HFModelSettings
from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM, MPTModelSettings

__all__ = ["HFCausalLM", "HFModelSettings", "MPTConfig", "MPTForCausalLM", "MPTModelSettings"]
