"""What the trainer needs from a model: the ``CausalLM`` protocol.

Every model builder registered in ``registry.models`` returns an ``nn.Module`` that has these members; the
trainer, the parallelism code and the callbacks use them directly, never by probing with ``getattr``. Our MPT
(``models.mpt``) and the transformers wrapper (``models.hf``) implement it; a plugin model does too, and
``check_causal_lm`` names what one lacks when it is built.
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
