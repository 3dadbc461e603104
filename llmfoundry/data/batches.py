"""What a loader batch holds, counted as Composer counts it (llm-foundry's ``get_tokens_per_batch_func``)."""

from __future__ import annotations

import torch


def count_batch_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The batch's tokens without padding: its attention mask's ones (every id without one), plus the decoder's
    (``decoder_attention_mask``) in an encoder-decoder batch. What ``max_duration``/intervals in ``tok`` count."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    tokens = mask.sum() if mask is not None else ids.new_tensor(ids.numel())
    decoder_mask = batch.get("decoder_attention_mask")
    if decoder_mask is not None:
        tokens = tokens + decoder_mask.sum()
    return tokens
