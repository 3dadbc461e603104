"""Model builders: `mpt_causal_lm` (mpt_causal_lm.py), `hf_causal_lm` (hf.py) and `hf_t5` (hf_t5.py), declared with
their settings in catalog.py, the registry's light list of the built-in names (with the refused hosted-API ones)."""
