"""Session fixtures for the recipe tests: tiny model folders and a tiny training checkpoint.

Everything is built locally from the shared ``corpus`` / ``tokenizer_dir`` / ``mds_root`` fixtures (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_trainer
from tests.recipes.helpers import MDS_SEQ, TINY_MPT, TINY_SEQ


def _tiny_mpt(tokenizer, **attn):
    import torch

    from llmfoundry.models.mpt.config import MPTConfig
    from llmfoundry.models.mpt.model import MPTForCausalLM

    torch.manual_seed(0)
    # transformers' MptForCausalLM has a 4x GELU MLP and bias-free norms: the shape export needs
    config = MPTConfig(**{**TINY_MPT, "expansion_ratio": 4}, learned_pos_emb=False, no_bias=True,
                       attn_config={"attn_impl": "torch", "alibi": True, **attn})
    return MPTForCausalLM(config).eval()


@pytest.fixture(scope="session")
def mpt_hf_folder(tmp_path_factory, tokenizer):
    """A tiny MPT exported with `llmfoundry convert`'s export (transformers' MptForCausalLM + tokenizer)."""
    from llmfoundry.models.hf_export import export_hf

    out = tmp_path_factory.mktemp("mpt_hf")
    export_hf(_tiny_mpt(tokenizer), tokenizer, out, "fp32")
    return out


@pytest.fixture(scope="session")
def llama_hf_folder(tmp_path_factory, tokenizer):
    """A tiny transformers LlamaForCausalLM folder with the test tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=TINY_SEQ,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    out = tmp_path_factory.mktemp("llama_hf")
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, mds_root, tokenizer_dir) -> Path:
    """A save_folder holding one llmfoundry checkpoint of the tiny ALiBi MPT (what `load_path` recipes start from)."""
    save_folder = tmp_path_factory.mktemp("tiny_run")
    data = {"local": str(mds_root), "max_seq_len": MDS_SEQ}
    plain = {
        "max_seq_len": TINY_SEQ,
        "model": {"name": "mpt_causal_lm", **TINY_MPT, "learned_pos_emb": False,
                  "attn_config": {"attn_impl": "sdpa", "alibi": True}},
        "tokenizer": {"name": str(tokenizer_dir)},
        "train_loader": {"name": "text", "dataset": {**data, "split": "train"}},
        "optimizer": {"name": "decoupled_adamw", "lr": 1e-3},
        "max_duration": "1ba",
        "global_train_batch_size": 4,
        "progress_bar": False,
        "log_to_console": False,
        "save_folder": str(save_folder),
        "save_interval": "1ba",
    }
    make_trainer(plain).fit()
    assert (save_folder / "latest").is_file(), "the tiny run saved no checkpoint"
    return save_folder
