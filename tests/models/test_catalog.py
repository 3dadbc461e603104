"""The models' catalog and schemas stay light: a model section validates without torch or transformers, and the
activations accepted without torch are ones torch accepts."""

import subprocess
import sys
import warnings

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.layers.act_fn import KNOWN_ACTIVATIONS, activation_problem, trial_problem
from llmfoundry.registry import models

CHECK_WITHOUT_TORCH = """
import sys
from llmfoundry.config.validate import validate
from llmfoundry.registry import models
assert models.names() == ["hf_causal_lm", "hf_t5", "mpt_causal_lm"], models.names()
validate({"d_model": 64, "n_heads": 4, "n_layers": 4, "learned_pos_emb": False, "activation_checkpointing_target":
          {"mptblock": "first-2"}, "ffn_config": {"ffn_type": "mb_dmoe", "moe_num_experts": 4, "moe_top_k": 2,
          "ffn_act_fn": {"name": "silu"}}, "attn_config": {"rope": True, "rope_impl": "hf",
          "rope_hf_config": {"type": "linear", "factor": 2.0}}, "additional_train_metrics": ["masked_accuracy"]},
         models.get("mpt_causal_lm").config, "model")
validate({"pretrained_model_name_or_path": "gpt2"}, models.get("hf_causal_lm").config, "model")
validate({"pretrained_model_name_or_path": "t5-small"}, models.get("hf_t5").config, "model")
heavy = sorted(m for m in ("torch", "transformers", "numpy", "tokenizers", "sentencepiece", "streaming")
               if m in sys.modules)
assert not heavy, heavy
"""


def test_model_sections_validate_without_torch_or_transformers():
    result = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TORCH], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", sorted(KNOWN_ACTIVATIONS))
def test_the_activations_accepted_without_torch_pass_the_torch_trial(name):
    for kwargs in KNOWN_ACTIVATIONS[name]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the trial would show a warning that the shortcut hides
            assert trial_problem(name, kwargs) is None, (name, kwargs)


def test_other_activations_are_tried_on_torch():
    assert activation_problem({"name": "leaky_relu", "negative_slope": 0.2}) is None
    assert activation_problem({"name": "gelu_tanh"}) is None
    assert activation_problem({"name": "swish"}).startswith(".name: 'swish' is not a function")
    assert activation_problem({"name": "gelu", "approximate": "sigmoid"}).startswith(": torch.nn.functional.gelu(")


def test_hosted_api_model_names_are_refused_with_the_harness_model():
    with pytest.raises(ConfigError, match="lm_eval --model openai-chat-completions"):
        models.get("openai_chat", key="model.name")
