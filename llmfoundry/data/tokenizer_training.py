"""Train a small byte-level BPE tokenizer locally and save it as a Hugging Face tokenizer folder.

Used by the quickstart (which must not download anything) and by the tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path, *, chat_template: str | None = None):
    """Train a byte-level BPE on ``texts`` and save it to ``out_dir``; returns the loaded HF tokenizer.

    Byte-level: every string is encodable (no unknown token). ``<|endoftext|>`` is EOS and BOS, ``<|pad|>`` pads.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    if chat_template is not None:
        hf_tokenizer.chat_template = chat_template
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tokenizer.save_pretrained(str(out_dir))
    return AutoTokenizer.from_pretrained(str(out_dir))
