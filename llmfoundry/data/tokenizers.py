"""Build the tokenizer a recipe names: a Hugging Face folder or hub id, a SentencePiece ``.model`` file, or tiktoken.

``build_tokenizer(name, kwargs)`` returns a ``transformers.PreTrainedTokenizerBase`` in every case, so the rest of
llmfoundry needs to know only one interface. YAML::

    tokenizer:
      name: EleutherAI/gpt-neox-20b          # or ./my_tokenizer/, ./spm.model, tiktoken
      kwargs: {model_max_length: 2048}        # for tiktoken: {encoding_name: cl100k_base} or {model_name: gpt-4}

A ``.model`` file (BPE or unigram) is run by sentencepiece itself, so its ids are exactly ``sp.encode``'s.
Every tokenizer must have an EOS token (pretraining concatenates documents with it; finetuning ends responses
with it); one without is a ConfigError that says how to set it (``kwargs.eos_token``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import sentencepiece as spm
from transformers import AutoTokenizer, PretrainedConfig
from transformers.tokenization_utils_base import BatchEncoding, TruncationStrategy
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend
from transformers.utils import PaddingStrategy

from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.data import tiktoken_tokenizer  # noqa: F401  (registers `tiktoken`)
from llmfoundry.registry import tokenizers as tokenizer_registry

def build_tokenizer(name: str, kwargs: dict[str, Any] | None = None, *, cli: bool = False):
    """The tokenizer called ``name`` (see the module docstring), with ``kwargs`` passed to its constructor.

    ``cli=True`` (the converters) words errors with the command-line flags (``--tokenizer``,
    ``--tokenizer_kwargs '{"eos_token": ...}'``) instead of the YAML keys (``tokenizer.name``, ``tokenizer.kwargs``).
    """
    try:
        kwargs = dict(kwargs or {})
        trust_remote_code = kwargs.pop("trust_remote_code", None)  # only Hugging Face tokenizers can run code
        if not isinstance(name, str) or not name:
            raise ConfigError("tokenizer.name: expected a Hugging Face tokenizer id or folder, a .model file, or 'tiktoken'")
        if name in tokenizer_registry:
            tokenizer = tokenizer_registry.get(name, key="tokenizer.name").builder(name, kwargs)
        elif name.endswith(".model") and os.path.isfile(name):
            tokenizer = _sentencepiece(name, kwargs)
        else:
            if trust_remote_code is not None:
                kwargs["trust_remote_code"] = bool(trust_remote_code)
            tokenizer = _huggingface(name, kwargs)
        _require_eos(tokenizer, name, cli)
    except ConfigError as error:
        if cli:
            raise ConfigError(cli_wording(str(error))) from None
        raise
    return tokenizer


def cli_wording(message: str) -> str:
    """A tokenizer error worded with the converters' flags instead of the YAML keys."""
    message = message.replace("set tokenizer.kwargs.trust_remote_code: true", "pass --trust-remote-code")
    message = re.sub(r"tokenizer\.kwargs\.(\w+)", r"--tokenizer_kwargs key '\1'", message)
    return message.replace("tokenizer.kwargs", "--tokenizer_kwargs").replace("tokenizer.name", "--tokenizer")


def _require_eos(tokenizer, name: str, cli: bool = False) -> None:
    if tokenizer.eos_token is not None and tokenizer.eos_token_id is not None:
        return
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t][:6]
    choices = f" (its special tokens: {', '.join(specials)})" if specials else ""
    example = specials[0] if specials else "<|endoftext|>"
    if cli:
        how = f"pass --tokenizer_kwargs '{{\"eos_token\": \"{example}\"}}' with one of its tokens{choices}"
        raise ConfigError(f"--tokenizer: tokenizer '{name}' has no EOS token; {how}; documents are separated "
                          "and responses terminated with EOS")
    raise ConfigError(
        f"tokenizer.name: tokenizer '{name}' has no EOS token; set tokenizer.kwargs.eos_token to one of its "
        f"tokens{choices} (documents are separated and responses terminated with EOS)"
    )


def load_saved_tokenizer(folder: str | os.PathLike, **kwargs: Any):
    """A tokenizer folder as it was saved: ours (a SentencePiece model keeps sentencepiece's own encode/decode) or
    any other through AutoTokenizer. For reloading checkpoints and exports; build_tokenizer is for recipes."""
    if _is_saved_sentencepiece(str(folder)):  # written by SentencePieceTokenizer.save_pretrained
        return SentencePieceTokenizer.from_pretrained(str(folder), **kwargs)
    if "config" not in kwargs and _holds_llm_foundry_mpt(str(folder)):
        # AutoTokenizer parses config.json with transformers' strict MptConfig, which refuses llm-foundry's MPT
        # options (GQA, float dropouts, ...); the tokenizer does not depend on them
        kwargs = {**kwargs, "config": PretrainedConfig()}
    return AutoTokenizer.from_pretrained(str(folder), **kwargs)


def _holds_llm_foundry_mpt(folder: str) -> bool:
    """Whether ``folder`` is a model folder of llm-foundry's MPT (its config.json has keys transformers' MPT lacks)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return False
    return values.get("model_type") == "mpt" and ("ffn_config" in values or "MPTForCausalLM" in
                                                 (values.get("architectures") or []))


def _looks_like_a_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else (./x, /x, ~/x, a/b/c) can only be a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _huggingface(name: str, kwargs: dict[str, Any]):
    if _looks_like_a_path(name) and not os.path.exists(os.path.expanduser(name)):
        raise ConfigError(f"tokenizer.name: folder '{name}' does not exist (check the path; a Hub id is org/name)")
    try:
        return load_saved_tokenizer(name, **kwargs)
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        raise ConfigError(f"tokenizer.name: tokenizer '{name}' runs its own code; if you trust it, set "
                          "tokenizer.kwargs.trust_remote_code: true") from None
    except OSError as error:
        where = "folder" if os.path.isdir(name) else "hub id"
        hint = (
            "check the path, or set HF_HUB_OFFLINE=0 and network access to download it"
            if not os.path.isdir(name)
            else "the folder needs tokenizer.json or tokenizer_config.json (save it with tokenizer.save_pretrained)"
        )
        raise ConfigError(f"tokenizer.name: cannot load tokenizer {where} '{name}' ({hint}): {error}".replace("\n", " "))


def _is_saved_sentencepiece(folder: str) -> bool:
    config = Path(folder) / "tokenizer_config.json"
    if not (Path(folder) / "tokenizer.model").is_file() or not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") == "SentencePieceBackend"
    except (ValueError, OSError):
        return False


@tokenizer_registry.register("sentencepiece")
def _sentencepiece_by_kwargs(name: str, kwargs: dict[str, Any]):
    """``name: sentencepiece`` with ``kwargs.model_file: path/to/spm.model``."""
    model_file = kwargs.pop("model_file", None)
    if not model_file:
        raise ConfigError("tokenizer.kwargs.model_file: required with tokenizer.name 'sentencepiece' (a .model file)")
    return _sentencepiece(model_file, kwargs)


def _sentencepiece(model_file: str, kwargs: dict[str, Any]):
    """A SentencePiece model file (BPE or unigram), tokenizing exactly like ``SentencePieceProcessor.encode``."""
    if not os.path.isfile(model_file):
        raise ConfigError(f"tokenizer.kwargs.model_file: '{model_file}' does not exist")
    try:
        return SentencePieceTokenizer(vocab_file=model_file, **kwargs)
    except (RuntimeError, OSError) as error:  # sentencepiece: not a model file
        raise ConfigError(f"tokenizer.name: cannot load SentencePiece model '{model_file}' "
                          f"({first_line(error)})") from None


class SentencePieceTokenizer(SentencePieceBackend):
    """Transformers' ``SentencePieceBackend`` whose encode and decode are sentencepiece's.

    Conversions of a ``.model`` file to a fast (tokenizers) tokenizer approximate sentencepiece's normalizer and
    assume one model type (a unigram model converted as Llama's BPE tokenizes differently), so the model is run by
    sentencepiece itself: text between added/special tokens is encoded with ``sp.encode`` (ids, any model type,
    sentencepiece's own normalization, unknown pieces and byte fallback), and ids are decoded with ``sp.decode``.
    Special tokens default to the model's own ``<unk>``, ``<s>``, ``</s>`` (and pad piece, when it has one);
    ``add_bos_token``/``add_eos_token`` (default false) add them around encoded text. ``save_pretrained`` writes
    ``tokenizer.model`` with ``tokenizer_class: SentencePieceBackend``, which plain transformers loads (same ids).
    """

    def __init__(self, vocab_file: str, **kwargs):
        sp = spm.SentencePieceProcessor(model_file=str(vocab_file))
        for name, piece_id in (("unk_token", sp.unk_id()), ("bos_token", sp.bos_id()),
                               ("eos_token", sp.eos_id()), ("pad_token", sp.pad_id())):
            if 0 <= piece_id < sp.get_piece_size():
                kwargs.setdefault(name, sp.id_to_piece(piece_id))
        add_bos, add_eos = bool(kwargs.pop("add_bos_token", False)), bool(kwargs.pop("add_eos_token", False))
        kwargs.setdefault("special_tokens_pattern",
                          {(False, False): "none", (True, False): "bos", (False, True): "eos"}.get((add_bos, add_eos), "bos_eos"))
        kwargs["legacy"] = True  # sentencepiece's own dummy prefix, never stripped
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(vocab_file=str(vocab_file), **kwargs)

    def _sp_ids(self, text: str, split_special_tokens: bool) -> list[int]:
        if split_special_tokens:
            return self.sp_model.encode(text)
        ids: list[int] = []
        for part in self.tokens_trie.split(text):
            if part in self._added_tokens_encoder:
                ids.append(self._added_tokens_encoder[part])
            elif part:
                ids += self.sp_model.encode(part)
        return ids

    def _encode_plus(self, text, text_pair=None, add_special_tokens=True, padding_strategy=None,
                     truncation_strategy=None, max_length=None, stride=0, is_split_into_words=False,
                     pad_to_multiple_of=None, padding_side=None, return_tensors=None, return_token_type_ids=None,
                     return_attention_mask=None, return_overflowing_tokens=False, return_special_tokens_mask=False,
                     return_length=False, verbose=True, **kwargs):
        padding_strategy = padding_strategy or PaddingStrategy.DO_NOT_PAD
        truncation_strategy = truncation_strategy or TruncationStrategy.DO_NOT_TRUNCATE
        plain = not any(t.lstrip or t.rstrip or t.single_word for t in self._added_tokens_decoder.values())
        if (plain and isinstance(text, list) and text and all(isinstance(t, str) for t in text)
                and text_pair is None and not is_split_into_words
                and padding_strategy == PaddingStrategy.DO_NOT_PAD
                and truncation_strategy == TruncationStrategy.DO_NOT_TRUNCATE and return_tensors is None
                and not (return_token_type_ids or return_overflowing_tokens or return_special_tokens_mask
                         or return_length or kwargs.get("return_offsets_mapping")
                         or kwargs.get("sanitize_control_tokens"))):
            return self._encode_batch(text, add_special_tokens, return_attention_mask is not False,
                                      kwargs.get("split_special_tokens", self.split_special_tokens))
        if (not isinstance(text, str) or (text_pair is not None and not isinstance(text_pair, str))
                or is_split_into_words or kwargs.get("sanitize_control_tokens") or not plain):
            return super()._encode_plus(
                text, text_pair=text_pair, add_special_tokens=add_special_tokens, padding_strategy=padding_strategy,
                truncation_strategy=truncation_strategy, max_length=max_length, stride=stride,
                is_split_into_words=is_split_into_words, pad_to_multiple_of=pad_to_multiple_of,
                padding_side=padding_side, return_tensors=return_tensors, return_token_type_ids=return_token_type_ids,
                return_attention_mask=return_attention_mask, return_overflowing_tokens=return_overflowing_tokens,
                return_special_tokens_mask=return_special_tokens_mask, return_length=return_length, verbose=verbose,
                **kwargs,
            )
        split = kwargs.pop("split_special_tokens", self.split_special_tokens)
        first = self._sp_ids(text, split)
        second = self._sp_ids(text_pair, split) if text_pair is not None else None
        return self.prepare_for_model(
            first, pair_ids=second, add_special_tokens=add_special_tokens, padding=padding_strategy.value,
            truncation=truncation_strategy.value, max_length=max_length, stride=stride,
            pad_to_multiple_of=pad_to_multiple_of, padding_side=padding_side, return_tensors=return_tensors,
            prepend_batch_axis=True, return_attention_mask=return_attention_mask,
            return_token_type_ids=return_token_type_ids, return_overflowing_tokens=return_overflowing_tokens,
            return_special_tokens_mask=return_special_tokens_mask, return_length=return_length, verbose=verbose,
        )

    def _encode_batch(self, texts: list[str], add_special_tokens: bool, attention_mask: bool, split: bool):
        """A batch of plain texts in one ``sp.encode`` call (what the converters send: the fast path)."""
        ids: list[list[int] | None] = [None] * len(texts)
        plain: list[int] = []
        added = [] if split else [token for token in self._added_tokens_encoder if token]
        for i, text in enumerate(texts):
            if not any(token in text for token in added):  # substring tests: far cheaper than the trie
                plain.append(i)
            else:
                ids[i] = self._sp_ids(text, split)
        for i, encoded in zip(plain, self.sp_model.encode([texts[i] for i in plain])):
            ids[i] = encoded
        if add_special_tokens:
            ids = [self.build_inputs_with_special_tokens(row) for row in ids]
        data: dict[str, Any] = {"input_ids": ids}
        if attention_mask and "attention_mask" in self.model_input_names:
            data["attention_mask"] = [[1] * len(row) for row in ids]
        return BatchEncoding(data)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.sp_model.decode_pieces(list(tokens))

    def _decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None, **kwargs):
        """``sp.decode`` of the pieces; control tokens (``</s>``...) and added tokens by their text."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        size = self.sp_model.get_piece_size()
        parts: list[str] = []
        run: list[int] = []
        for i in token_ids:
            i = int(i)
            added = self._added_tokens_decoder.get(i)
            if 0 <= i < size and (added is None or not self.sp_model.is_control(i)):
                run.append(i)  # sentencepiece renders its pieces, unknown and byte pieces included
                continue
            if run:
                parts.append(self.sp_model.decode(run))
                run = []
            if added is None:
                raise IndexError(f"token id {i} is outside the vocabulary (size {len(self)})")
            if not (skip_special_tokens and added.special):
                parts.append(added.content)
        if run:
            parts.append(self.sp_model.decode(run))
        text = "".join(parts)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean else text

    def save_pretrained(self, save_directory, *args, **kwargs):
        files = super().save_pretrained(save_directory, *args, **kwargs)
        config_path = Path(save_directory) / "tokenizer_config.json"
        if config_path.is_file():  # loadable by plain transformers (same ids) and by build_tokenizer (this class)
            config = json.loads(config_path.read_text(encoding="utf-8"))
            config["tokenizer_class"] = "SentencePieceBackend"
            config.pop("special_tokens_pattern", None)
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                   encoding="utf-8")
        return files
