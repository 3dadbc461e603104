"""MPT: the architecture's options (arch.py, light: the recipe schema), its transformers config (config.py) and the
model (model.py, which lets transformers' Auto classes open our folders once imported); the `mpt_causal_lm` builder
is llmfoundry.models.mpt_causal_lm."""
