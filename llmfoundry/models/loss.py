"""The causal language-modelling loss, shared by the models' ``forward(labels=...)`` and the trainer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # labels with this value (padding, prompts) carry no loss


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: position t predicts labels[t + 1] (labels are not pre-shifted); -100 is ignored.
    ``reduction="sum"`` lets the trainer normalise over a whole batch split into microbatches."""
    vocab = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


def count_target_tokens(labels: torch.Tensor) -> torch.Tensor:
    """The number of positions that carry a loss (what ``causal_lm_loss(..., "sum")`` is summed over)."""
    return (labels[:, 1:] != IGNORE_INDEX).sum()


def count_correct_tokens(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many target positions the model's argmax predicts right (llm-foundry's TokenAccuracy numerator)."""
    targets = labels[:, 1:]
    return ((logits[:, :-1].argmax(dim=-1) == targets) & (targets != IGNORE_INDEX)).sum()
