"""Plain helpers shared by several test folders (fixtures live in the conftest.py files).

Test modules import these as ``from tests.helpers import ...``; no test module imports a conftest.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# The bucket the ``s3_server`` fixture (tests/conftest.py) creates on the moto server.
S3_TEST_BUCKET = "llmfoundry-test"

_WORDS = (
    "the a model learns to predict next token from data which flows through layers of attention and "
    "feed forward networks while an optimizer updates weights after each batch of text samples in order "
    "cat dog runs jumps quickly slowly over under river mountain city small large blue green red"
).split()


def make_corpus(num_docs: int = 200, seed: int = 0) -> list[str]:
    """Deterministic English-like documents of a few sentences each."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
            sentences.append(" ".join(words).capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def write_prompt_response_jsonl(path: Path, docs: list[str]) -> Path:
    """A finetuning JSONL file: per document with two sentences or more, the first is the prompt, the rest the response."""
    rows = [doc.split(". ", 1) for doc in docs if ". " in doc]
    path.write_text("".join(json.dumps({"prompt": p + ".", "response": " " + r}) + "\n" for p, r in rows))
    return path


def write_text_folder(folder: Path, docs: list[str]) -> Path:
    """One .txt file per document in ``folder`` (created if needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_text(doc)
    return folder


def convert_text_folder(source: Path, out: Path, tokenizer_dir: Path, concat_tokens: int) -> Path:
    """MDS shards of ``concat_tokens``-token samples in ``out``, made from the .txt files in ``source``."""
    from llmfoundry.data.prep import text

    argv = ["--input_folder", str(source), "--output_folder", str(out), "--concat_tokens", str(concat_tokens),
            "--tokenizer", str(tokenizer_dir), "--processes", "1", "--quiet"]
    assert text.main(argv) == 0, f"the text converter failed on {source}"
    return out


# Sequence length of the MDS samples in the ``mds_root`` fixture and of the tiny training recipe.
TINY_RECIPE_SEQ = 64


def tiny_recipe(mds_root: Path, tokenizer_dir: Path, **overrides) -> dict:
    """A tiny training recipe (a 2-layer MPT, 12 batches) over the ``mds_root`` fixture's train/val splits."""
    seq = TINY_RECIPE_SEQ
    recipe = {
        "seed": 7,
        "max_seq_len": seq,
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": seq, "vocab_size": 512, "attn_config": {"attn_impl": "torch", "alibi": True},
                  "learned_pos_emb": False},
        "tokenizer": {"name": str(tokenizer_dir)},
        "train_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "train", "shuffle": True,
                                                     "shuffle_seed": 3, "max_seq_len": seq}, "drop_last": True},
        "eval_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": seq},
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


def make_trainer(recipe: dict):
    """A Trainer for a plain recipe dict, validated as ``llmfoundry train`` validates it."""
    from llmfoundry.train.recipe import TrainConfig, validate
    from llmfoundry.train.trainer import Trainer

    return Trainer(validate(recipe, TrainConfig), recipe)


def weights(trainer) -> dict:
    """A detached copy of a trainer's model weights (to compare runs bitwise)."""
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def batch_rows(batches) -> list[tuple[int, ...]]:
    """Every sample of a sequence of loader batches, as tuples of token ids (to compare data orders)."""
    return [tuple(r) for b in batches for r in b["input_ids"].tolist()]


def write_tiny_gpt2(folder: Path, vocab_size: int = 512, seq: int = TINY_RECIPE_SEQ, seed: int = 17) -> Path:
    """A 2-layer GPT-2 (d 64, 4 heads, no dropout) saved as a Hugging Face folder, for ``hf_causal_lm`` recipes.

    The weights are drawn here from ``seed`` (normal(0, 0.02) for matrices and embeddings, zero biases, unit norm
    weights), not by transformers' initialisers, so every transformers version writes the same folder.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if (folder / "config.json").exists():
        return folder
    config = GPT2Config(vocab_size=vocab_size, n_positions=seq, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.transformer.named_parameters()):
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(folder)
    return folder
