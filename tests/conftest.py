"""Shared fixtures: a tiny locally trained tokenizer and a tiny text corpus (nothing is downloaded)."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, corpus):
    """A folder holding a 512-token byte-level BPE tokenizer trained on ``corpus`` (AutoTokenizer loads it)."""
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_bpe_tokenizer(corpus, vocab_size=512, out_dir=out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))
