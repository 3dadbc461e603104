"""Fixtures for trainer tests: tiny MDS data and a tiny recipe."""

from __future__ import annotations

import pytest
import yaml


@pytest.fixture(scope="session")
def mds_root(tmp_path_factory, corpus, tokenizer_dir):
    """MDS shards of 64-token samples from the test corpus, in root/train and root/val."""
    from llmfoundry.data.prep import text

    root = tmp_path_factory.mktemp("mds")
    for split, docs in {"train": corpus[:160], "val": corpus[160:]}.items():
        source = root / "text" / split
        source.mkdir(parents=True)
        for i, doc in enumerate(docs):
            (source / f"{i:04d}.txt").write_text(doc)
        text.main(["--input_folder", str(source), "--output_folder", str(root / split), "--tokenizer",
                   str(tokenizer_dir), "--concat_tokens", "64", "--processes", "1", "--quiet"])
    return root


def tiny_recipe(mds_root, tokenizer_dir, **overrides) -> dict:
    recipe = {
        "seed": 7,
        "max_seq_len": 64,
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": 64, "vocab_size": 512, "attn_config": {"attn_impl": "torch", "alibi": True},
                  "learned_pos_emb": False},
        "tokenizer": {"name": str(tokenizer_dir)},
        "train_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "train", "shuffle": True,
                                                     "shuffle_seed": 3, "max_seq_len": 64}, "drop_last": True},
        "eval_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": 64},
                        "drop_last": False},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "weight_decay": 1e-5},
        "scheduler": {"name": "cosine_with_warmup", "t_warmup": "2ba", "alpha_f": 0.1},
        "algorithms": {"gradient_clipping": {"clipping_threshold": 1.0}},
        "max_duration": "12ba",
        "eval_interval": "6ba",
        "global_train_batch_size": 8,
        "device_train_microbatch_size": 4,
        "device_eval_batch_size": 8,
        "progress_bar": False,
        "log_to_console": False,
    }
    recipe.update(overrides)
    return recipe


def write_recipe(path, recipe: dict):
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture
def recipe(mds_root, tokenizer_dir):
    """recipe(**overrides) -> a tiny training recipe dict over the test MDS data."""
    return lambda **overrides: tiny_recipe(mds_root, tokenizer_dir, **overrides)
