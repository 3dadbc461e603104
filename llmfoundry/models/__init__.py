"""Model builders. Importing this package registers `mpt_causal_lm` and `hf_causal_lm` in llmfoundry.registry."""

from llmfoundry.models import mpt  # noqa: F401  (registers mpt_causal_lm)
from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

try:  # hf_causal_lm is written alongside; keep mpt usable while it is missing
    from llmfoundry.models import hf  # noqa: F401  (registers hf_causal_lm)
except ImportError:  # pragma: no cover
    pass

__all__ = ["MPTConfig", "MPTForCausalLM"]
