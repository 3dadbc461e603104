"""Model builders. Importing this package registers `mpt_causal_lm`, `hf_causal_lm` and `hf_t5` in
llmfoundry.registry (and the hosted-API model names, refused: models/api_models.py)."""

from llmfoundry.models import api_models, hf, hf_t5, mpt_causal_lm  # noqa: F401  (each registers on import)
from llmfoundry.models.hf import HFCausalLM, HFModelSettings
from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM, MPTModelSettings

__all__ = ["HFCausalLM", "HFModelSettings", "MPTConfig", "MPTForCausalLM", "MPTModelSettings"]
