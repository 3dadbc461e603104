"""Decoding shared by `llmfoundry generate` and `llmfoundry chat`: the device, generate() kwargs, context room (their
flags are inference/flags.py)."""

from __future__ import annotations

import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.interface import context_length


def sampling_options(temperature: float, top_p: float = 1.0, top_k: int = 0,
                     repetition_penalty: float = 1.0) -> dict:  # fmt: skip
    """generate() kwargs: sampling when temperature > 0, otherwise greedy, made explicit so that a model folder's
    generation_config cannot turn sampling back on."""
    if temperature > 0:
        options = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k or None)
    else:
        options = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    if repetition_penalty != 1.0:
        options["repetition_penalty"] = repetition_penalty
    return options


def position_limit(model) -> int | None:
    """The longest sequence a model can process at all: set by learned absolute position embeddings (our MPT's
    wpe, GPT-2-style models); None when positions are relative (ALiBi, RoPE) and longer inputs still run."""
    arch = getattr(model, "arch", None)
    if arch is not None and hasattr(arch, "learned_pos_emb"):
        return arch.max_seq_len if arch.learned_pos_emb else None
    if any(name.rsplit(".", 1)[-1] in ("wpe", "embed_positions") for name, _ in model.named_modules()):
        return context_length(model)
    return None


def check_room(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """A one-line error (not an index error deep in the embedding) when the output would outgrow the positions."""
    limit = position_limit(model)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ConfigError(f"--max_new_tokens: a {prompt_tokens}-token prompt plus {max_new_tokens} new tokens exceeds "
                          f"the model's {limit} learned positions (use --max_new_tokens {max(limit - prompt_tokens, 0)} "
                          "or less, or a shorter prompt)")


def device_named(name: str | None) -> str:
    """The ``--device`` flag's value, its default (None) resolved: cuda when available, else cpu."""
    return name or ("cuda" if torch.cuda.is_available() else "cpu")
