"""Every built-in `model.name`: the registry's provider module for models (llmfoundry.registry).

Each builder is declared by its ``"module:function"`` with the settings dataclass its section is validated
against, so that checking a recipe imports this light module and the settings modules only; the builder's module
(torch, transformers) is imported when the model is built.

llm-foundry's hosted-API model names (its ``inference_api_wrapper``) are refused with a one-line error. Those
wrappers send every ICL query to a hosted service (OpenAI, Databricks' foundation model APIs, a vLLM server)
through that service's Python client. This project evaluates models it holds (a checkpoint or a Hugging Face
folder) and has no API client; lm-evaluation-harness's API models do what these did.
"""

from __future__ import annotations

from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.settings import HFModelSettings, HFT5Settings
from llmfoundry.registry import models

models.declare("mpt_causal_lm", "llmfoundry.models.mpt_causal_lm:build_mpt", config=MPTModelSettings)
models.declare("hf_causal_lm", "llmfoundry.models.hf:build_hf_causal_lm", config=HFModelSettings)
models.declare("hf_t5", "llmfoundry.models.hf_t5:build_hf_t5", config=HFT5Settings)

# llm-foundry's registered name -> the lm-evaluation-harness model type that evaluates the same service
API_MODELS = {
    "openai_causal_lm": "openai-completions",
    "openai_chat": "openai-chat-completions",
    "fmapi_causal_lm": "local-completions",
    "fmapi_chat": "local-chat-completions",
    "vllm_causal_lm": "local-completions",
    "vllm_chat": "local-chat-completions",
}

for _name, _harness_model in API_MODELS.items():
    models.refuse(_name, f"llm-foundry's client of a hosted API; this project evaluates local models and has no API "
                         f"client (evaluate the service with lm-evaluation-harness: lm_eval --model {_harness_model})")
