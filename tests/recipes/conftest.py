"""Session fixtures for the recipe tests: tiny MDS data, tiny model folders and a tiny training checkpoint.

Everything is built locally from the shared ``corpus`` / ``tokenizer_dir`` fixtures (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The shape every recipe's model is shrunk to.
TINY_SEQ = 128  # model and finetuning rows (chat markup is long in the 512-token test vocabulary)
MDS_SEQ = 64  # tokens per pretraining sample
TINY_MPT = {"d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": TINY_SEQ, "vocab_size": 512}


@pytest.fixture(scope="session")
def recipe_mds(tmp_path_factory, corpus, tokenizer_dir) -> Path:
    """MDS shards of 64-token samples in root/train and root/val (the splits the pretraining recipes read)."""
    from llmfoundry.data.prep import text

    root = tmp_path_factory.mktemp("recipe_mds")
    for split, docs in {"train": corpus[:120], "val": corpus[120:160]}.items():
        source = root / "source" / split
        source.mkdir(parents=True)
        for i, doc in enumerate(docs):
            (source / f"{i:03d}.txt").write_text(doc)
        text.main(["--input_folder", str(source), "--output_folder", str(root / split), "--tokenizer",
                   str(tokenizer_dir), "--concat_tokens", str(MDS_SEQ), "--processes", "1", "--quiet"])
    return root


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
    from llmfoundry.models.convert import export_hf

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
def tiny_checkpoint(tmp_path_factory, recipe_mds, tokenizer_dir) -> Path:
    """A save_folder holding one llmfoundry checkpoint of the tiny ALiBi MPT (what `load_path` recipes start from)."""
    from llmfoundry.train.recipe import TrainConfig, validate
    from llmfoundry.train.trainer import Trainer

    save_folder = tmp_path_factory.mktemp("tiny_run")
    data = {"local": str(recipe_mds), "max_seq_len": MDS_SEQ}
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
    Trainer(validate(plain, TrainConfig), plain).fit()
    return save_folder
