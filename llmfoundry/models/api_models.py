"""llm-foundry's hosted-API model names (its ``inference_api_wrapper``): refused with a one-line error.

Those wrappers send every ICL query to a hosted service (OpenAI, Databricks' foundation model APIs, a vLLM server)
through that service's Python client. This project evaluates models it holds (a checkpoint or a Hugging Face
folder) and has no API client; lm-evaluation-harness's API models do what these did.
"""

from __future__ import annotations

from llmfoundry.registry import models

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
