"""The CausalLM protocol: what the trainer needs from every model builder's result."""

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf import HFCausalLM
from llmfoundry.models.interface import CausalLM, check_causal_lm
from tests.models.helpers import tiny_model


def _hf_wrapper() -> HFCausalLM:
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    return HFCausalLM(GPT2LMHeadModel(config).eval())


@pytest.mark.parametrize("make", [tiny_model, _hf_wrapper], ids=["mpt", "hf_causal_lm"])
def test_our_mpt_and_the_transformers_wrapper_are_causal_lms(make):
    model = make()
    assert isinstance(model, CausalLM)
    check_causal_lm(model, "model.name: 'test'")
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, nn.Embedding)
    assert len(model.blocks()) == 2 and model.flops_per_token(8) > 0
    assert model(torch.randint(0, embedding.num_embeddings, (1, 8))).logits.shape == (1, 8, embedding.num_embeddings)


def test_the_wrapper_hands_out_the_wrapped_models_embedding():
    model = _hf_wrapper()
    assert model.get_input_embeddings() is model.hf_model.transformer.wte


class ForwardOnly(nn.Module):
    def forward(self, input_ids):
        return input_ids


def test_check_causal_lm_names_each_member_a_module_lacks():
    with pytest.raises(ConfigError) as error:
        check_causal_lm(ForwardOnly(), "model.name: 'plugin'")
    message = str(error.value)
    assert message.startswith("model.name: 'plugin': the model builder returned a ForwardOnly without ")
    assert "supports_sequence_id, flops_per_token, blocks, get_input_embeddings" in message
    assert "forward" not in message.split(" without ")[1].split(" (")[0]


def test_check_causal_lm_asks_for_a_torch_module():
    with pytest.raises(ConfigError, match="without being a torch.nn.Module, supports_sequence_id, forward"):
        check_causal_lm(object(), "model.name: 'plugin'")
