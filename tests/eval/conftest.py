"""Fixtures for eval tests: tiny transformers models (random weights, nothing downloaded); helpers: helpers.py."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def llama(tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    torch.manual_seed(1)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=512)
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run far faster on one thread than on several threads competing for a busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
