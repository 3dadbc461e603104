"""The train recipe's ``prepare_data`` section, kept apart from the quickstart's builder (prep/quickstart.py, which
trains a tokenizer) so that checking a recipe imports neither tokenizers nor streaming."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmfoundry.config.fields import option


@dataclass(kw_only=True)
class PrepareDataConfig:
    """Data that `llmfoundry train` builds before training when it is missing (used by yamls/quickstart.yaml)."""

    corpus: Literal["python_stdlib"] = option(
        "python_stdlib", "text to train on: python_stdlib = the source files of this Python's standard library"
    )
    folder: str = option(doc="where the tokenizer (folder/tokenizer) and MDS shards (folder/train, folder/val) go")
    vocab_size: int = option(4096, "vocabulary size of the byte-level BPE tokenizer trained on the corpus")
    max_files: int = option(400, "at most this many source files are used (sorted by path; deterministic)")
    val_files: int = option(20, "files held out for the validation split")
    concat_tokens: int = option(256, "tokens per MDS sample")
