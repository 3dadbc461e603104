"""What the trainer needs from a model: the ``CausalLM`` protocol.

Every model builder registered in ``registry.models`` returns an ``nn.Module`` that has these members; the
trainer, the parallelism code and the callbacks use them directly, never by probing with ``getattr``. Our MPT
(``models.mpt``) and the transformers wrapper (``models.hf``) implement it; a plugin model does too, and
``check_causal_lm`` names what one lacks when it is built.

One member is optional: ``is_encoder_decoder = True`` marks a model whose forward also takes the batch's
``decoder_input_ids``/``decoder_attention_mask`` and whose logits are scored against ``labels`` without a shift
(``hf_t5``); ``label_offset`` reads it, so decoder-only plugin models need not declare it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from llmfoundry.core.errors import ConfigError


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model as the trainer sees it."""

    #: whether ``forward`` takes ``sequence_id`` (packed documents that must not attend to each other)
    supports_sequence_id: bool

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """(B, T) token ids -> an output whose ``.logits`` is (B, T, vocab); ``sequence_id=`` when supported."""
        ...

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token at sequence length ``seq_len``, for MFU."""
        ...

    def blocks(self) -> list[nn.Module]:
        """The repeated transformer blocks: each is sharded, checkpointed and compiled as a unit."""
        ...

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (its ``num_embeddings`` bounds the token ids a batch may hold)."""
        ...


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` declared itself an encoder-decoder model (the optional member above)."""
    return bool(getattr(model, "is_encoder_decoder", False))


def label_offset(model: Any) -> int:
    """How far ahead of a logit its label sits (llmfoundry.models.loss): 1 for causal LMs, 0 for encoder-decoder."""
    return 0 if is_encoder_decoder(model) else 1


def context_length(model) -> int | None:
    """The sequence length a model was built for (its config's max_seq_len / max_position_embeddings), if known."""
    config = getattr(model, "config", None)
    for key in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


MEMBERS = ("supports_sequence_id", "forward", "flops_per_token", "blocks", "get_input_embeddings")


def check_causal_lm(model: Any, where: str) -> None:
    """Raise a one-line ConfigError naming the members of :class:`CausalLM` that ``model`` (built for ``where``) lacks."""
    if isinstance(model, CausalLM) and isinstance(model, nn.Module):
        return
    missing = [m for m in MEMBERS if not hasattr(model, m)]
    what = type(model).__name__
    if not isinstance(model, nn.Module):
        missing.insert(0, "being a torch.nn.Module")
    raise ConfigError(f"{where}: the model builder returned a {what} without {', '.join(missing)} "
                    "(see llmfoundry.models.interface.CausalLM)")
