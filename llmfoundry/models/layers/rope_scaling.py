"""``rope_hf_config``'s scaling types and their keys, apart from the RoPE code (layers/positional.py) so that the
recipe schema (models/mpt/arch.py) can check them without torch."""

from __future__ import annotations

# rope_hf_config: the keys each scaling type reads (besides `type`), as transformers' rope_scaling names them
ROPE_SCALING_KEYS = {
    "no_scaling": {"factor"},
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
ROPE_SCALING_REQUIRED = {
    "linear": {"factor"}, "dynamic": {"factor"}, "yarn": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
