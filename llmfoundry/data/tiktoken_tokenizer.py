"""``tokenizer.name: tiktoken``: a tiktoken encoding as a Hugging Face fast tokenizer, with the keys of
llm-foundry's ``TiktokenTokenizerWrapper``::

    tokenizer:
      name: tiktoken
      kwargs:
        encoding_name: cl100k_base        # or model_name: gpt-4
        add_bos_token: false              # put bos_token before each encoded text
        add_eos_token: false              # put eos_token after each encoded text
        use_default_system_prompt: false  # the chat template starts conversations without a system message
                                          # with llm-foundry's default system prompt

As in llm-foundry, ``bos_token``, ``eos_token`` and ``unk_token`` default to ``<|endoftext|>`` (when the encoding has
it), ``pad_token`` to none, and the chat template to llm-foundry's ChatML variant (turns joined by newlines).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from llmfoundry.core.errors import ConfigError
from llmfoundry.registry import tokenizers as tokenizer_registry

ENDOFTEXT = "<|endoftext|>"
# llm-foundry's default system prompt (the same words, so chats tokenize to the same ids)
DEFAULT_SYSTEM_PROMPT = "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible."


def chatml_template(use_default_system_prompt: bool) -> str:
    """llm-foundry's tiktoken chat template: a leading system message (else, with ``use_default_system_prompt``,
    the default one) opens the first turn; turns are ``<|im_start|>role\\ncontent<|im_end|>`` joined by newlines;
    the generation prompt adds a newline and an open assistant turn."""
    default = repr(DEFAULT_SYSTEM_PROMPT) if use_default_system_prompt else "none"
    return (
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
        "{%- else -%}"
        f"{{%- set system = {default} -%}}{{%- set turns = messages -%}}"
        "{%- endif -%}"
        "{%- for message in turns -%}"
        "{%- if loop.first and system is not none -%}{{ '<|im_start|>system\n' + system | trim + '<|im_end|>\n' }}"
        "{%- endif -%}"
        "{%- if not loop.first -%}{{ '\n' }}{%- endif -%}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' }}"
        "{%- if add_generation_prompt and loop.last -%}{{ '\n<|im_start|>assistant\n' }}{%- endif -%}"
        "{%- endfor -%}"
    )


@tokenizer_registry.register("tiktoken")
def build_tiktoken(name: str, kwargs: dict[str, Any]):
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


_UNSET: Any = object()


def tiktoken_to_hf(encoding, *, add_bos_token: bool = False, add_eos_token: bool = False,
                   use_default_system_prompt: bool = False, bos_token: str | None = _UNSET,
                   eos_token: str | None = _UNSET, unk_token: str | None = _UNSET, pad_token: str | None = None,
                   errors: str = "replace", chat_template: str | None = None, **kwargs):
    """A ``PreTrainedTokenizerFast`` that tokenizes exactly like the ``tiktoken.Encoding`` ``encoding``, with
    llm-foundry's TiktokenTokenizerWrapper keys (see the module docstring)."""
    ranks: dict[bytes, int] = encoding._mergeable_ranks
    specials: dict[str, int] = encoding._special_tokens
    to_text = _byte_to_unicode()

    def text_of(token: bytes) -> str:
        return "".join(to_text[b] for b in token)

    vocab = {text_of(token): rank for token, rank in ranks.items()}
    vocab.update(specials)  # in the model's vocabulary, special tokens keep their tiktoken ids (gaps allowed)
    if errors != "replace":  # the byte-level decoder replaces invalid UTF-8 with U+FFFD, as errors='replace' does
        raise ConfigError(f"tokenizer.kwargs.errors: only 'replace' (llm-foundry's default) is supported, got '{errors}'")
    default = ENDOFTEXT if ENDOFTEXT in specials else None
    named = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token, "pad_token": pad_token}
    named = {k: (default if v is _UNSET else v) for k, v in named.items()}
    for key, token in named.items():
        if token is not None and token not in vocab:  # a new token would change the vocabulary: never silently
            raise ConfigError(f"tokenizer.kwargs.{key}: '{token}' is not a token of the tiktoken encoding "
                              f"'{encoding.name}' (its special tokens: {', '.join(specials) or 'none'})")
    for flag, is_set, key in (("add_bos_token", add_bos_token, "bos_token"), ("add_eos_token", add_eos_token, "eos_token")):
        if is_set and named[key] is None:
            raise ConfigError(f"tokenizer.kwargs.{flag}: the tokenizer has no {key}; set tokenizer.kwargs.{key}")
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
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in specials])
    # The special tokens go to the constructor, so that add_bos_token/add_eos_token find them when it builds the
    # post-processor (bos + text + eos; pairs: bos + a + eos + bos + b + eos, as llm-foundry's wrapper).
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, add_bos_token=add_bos_token, add_eos_token=add_eos_token,
        chat_template=chat_template or chatml_template(use_default_system_prompt),
        **{k: v for k, v in named.items() if v is not None}, **kwargs,
    )
