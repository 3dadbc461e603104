"""Build the tokenizer a recipe names: a Hugging Face folder or hub id, a SentencePiece ``.model`` file, or tiktoken.

``build_tokenizer(name, kwargs)`` returns a ``transformers.PreTrainedTokenizerBase`` in every case, so the rest of
llmfoundry needs to know only one interface. YAML::

    tokenizer:
      name: EleutherAI/gpt-neox-20b          # or ./my_tokenizer/, ./spm.model, tiktoken
      kwargs: {model_max_length: 2048}        # for tiktoken: {encoding_name: cl100k_base} or {model_name: gpt-4}

Every tokenizer must have an EOS token (pretraining concatenates documents with it; finetuning ends responses
with it); one without is a ConfigError that says how to set it (``kwargs.eos_token``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from llmfoundry.config.errors import ConfigError
from llmfoundry.registry import tokenizers as tokenizer_registry

TIKTOKEN_EOS = "<|endoftext|>"


def build_tokenizer(name: str, kwargs: dict[str, Any] | None = None):
    """The tokenizer called ``name`` (see the module docstring), with ``kwargs`` passed to its constructor."""
    kwargs = dict(kwargs or {})
    if not isinstance(name, str) or not name:
        raise ConfigError("tokenizer.name: expected a Hugging Face tokenizer id or folder, a .model file, or 'tiktoken'")
    if name in tokenizer_registry:
        tokenizer = tokenizer_registry.get(name, key="tokenizer.name").builder(name, kwargs)
    elif name.endswith(".model") and os.path.isfile(name):
        tokenizer = _sentencepiece(name, kwargs)
    else:
        tokenizer = _huggingface(name, kwargs)
    _require_eos(tokenizer, name)
    return tokenizer


def _require_eos(tokenizer, name: str) -> None:
    if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
        raise ConfigError(
            f"tokenizer.name: tokenizer '{name}' has no EOS token; set tokenizer.kwargs.eos_token to one of its "
            "special tokens (documents are separated and responses terminated with EOS)"
        )


def _huggingface(name: str, kwargs: dict[str, Any]):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except OSError as error:
        where = "folder" if os.path.isdir(name) else "hub id"
        hint = (
            "check the path, or set HF_HUB_OFFLINE=0 and network access to download it"
            if not os.path.isdir(name)
            else "the folder needs tokenizer.json or tokenizer_config.json (save it with tokenizer.save_pretrained)"
        )
        raise ConfigError(f"tokenizer.name: cannot load tokenizer {where} '{name}' ({hint}): {error}".replace("\n", " "))


@tokenizer_registry.register("sentencepiece")
def _sentencepiece_by_kwargs(name: str, kwargs: dict[str, Any]):
    """``name: sentencepiece`` with ``kwargs.model_file: path/to/spm.model``."""
    model_file = kwargs.pop("model_file", None)
    if not model_file:
        raise ConfigError("tokenizer.kwargs.model_file: required with tokenizer.name 'sentencepiece' (a .model file)")
    return _sentencepiece(model_file, kwargs)


def _sentencepiece(model_file: str, kwargs: dict[str, Any]):
    """A SentencePiece model file, converted to a fast (Llama-style, Metaspace) tokenizer."""
    from transformers import LlamaTokenizer

    if not os.path.isfile(model_file):
        raise ConfigError(f"tokenizer.kwargs.model_file: '{model_file}' does not exist")
    with tempfile.TemporaryDirectory(prefix="llmfoundry-spm-") as folder:
        shutil.copyfile(model_file, Path(folder) / "tokenizer.model")
        kwargs.setdefault("add_bos_token", False)
        return LlamaTokenizer.from_pretrained(folder, **kwargs)


@tokenizer_registry.register("tiktoken")
def _tiktoken(name: str, kwargs: dict[str, Any]):
    """``name: tiktoken`` with ``kwargs.encoding_name`` (e.g. cl100k_base) or ``kwargs.model_name`` (e.g. gpt-4).

    The tiktoken encoding becomes an equivalent byte-level BPE ``PreTrainedTokenizerFast`` (same ids, same
    splits), so batch encoding runs in Rust like any HF tokenizer. tiktoken reads its files from
    ``TIKTOKEN_CACHE_DIR``; offline, that cache must hold them. ``kwargs.encoding`` may be a ``tiktoken.Encoding``.
    """
    try:
        import tiktoken
    except ImportError as error:
        raise ConfigError("tokenizer.name: 'tiktoken' needs the tiktoken package (pip install tiktoken)") from error
    encoding = kwargs.pop("encoding", None)
    encoding_name = kwargs.pop("encoding_name", None)
    model_name = kwargs.pop("model_name", None)
    if encoding is None:
        if (encoding_name is None) == (model_name is None):
            raise ConfigError(
                "tokenizer.kwargs: with tokenizer.name 'tiktoken' set exactly one of encoding_name (e.g. cl100k_base) "
                "or model_name (e.g. gpt-4)"
            )
        try:
            encoding = tiktoken.get_encoding(encoding_name) if encoding_name else tiktoken.encoding_for_model(model_name)
        except (KeyError, ValueError) as error:
            which = f"encoding_name '{encoding_name}'" if encoding_name else f"model_name '{model_name}'"
            raise ConfigError(
                f"tokenizer.kwargs: unknown tiktoken {which}; known encodings: {', '.join(tiktoken.list_encoding_names())}"
            ) from error
        except Exception as error:  # network failure while fetching the BPE file
            raise ConfigError(
                f"tokenizer.kwargs: cannot load tiktoken files ({type(error).__name__}); put them in TIKTOKEN_CACHE_DIR "
                "or allow network access"
            ) from error
    return tiktoken_to_hf(encoding, **kwargs)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters (what ByteLevel pre-tokenizers use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _split_in_two(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two parts tiktoken's BPE merges last to form ``token`` (merging only pairs of lower rank)."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while True:
        best, best_rank = None, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < limit and (best_rank is None or rank < best_rank):
                best, best_rank = i, rank
        if best is None:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise ValueError(f"tiktoken token {token!r} is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def tiktoken_to_hf(encoding, *, eos_token: str | None = None, **kwargs):
    """A ``PreTrainedTokenizerFast`` that tokenizes exactly like the ``tiktoken.Encoding`` ``encoding``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ranks: dict[bytes, int] = encoding._mergeable_ranks
    specials: dict[str, int] = encoding._special_tokens
    to_text = _byte_to_unicode()

    def text_of(token: bytes) -> str:
        return "".join(to_text[b] for b in token)

    vocab = {text_of(token): rank for token, rank in ranks.items()}
    vocab.update(specials)  # in the model's vocabulary, special tokens keep their tiktoken ids (gaps allowed)
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = _split_in_two(ranks, token)
            merges.append((text_of(left), text_of(right)))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(encoding._pat_str), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    if eos_token is None:
        eos_token = TIKTOKEN_EOS if TIKTOKEN_EOS in specials else None
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    if eos_token is not None:
        tokenizer.eos_token = eos_token
    return tokenizer
