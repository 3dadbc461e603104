"""The language-modelling loss, shared by the models' ``forward(labels=...)``, the trainer and the metrics.

``offset`` is how far ahead of a logit its label sits (``models.interface.label_offset``): 1 for causal LMs, whose
labels are not pre-shifted (position t predicts labels[t + 1]); 0 for encoder-decoder models, whose ``labels`` are
the decoder's targets (position t predicts labels[t], as transformers' T5 scores them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmfoundry.models.chunked_loss import target_log_probs

IGNORE_INDEX = -100  # labels with this value (padding, prompts) carry no loss


def _aligned(logits: torch.Tensor, labels: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) with position t of one scored against position t of the other."""
    if offset == 0:
        return logits, labels
    return logits[:, :-offset], labels[:, offset:]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean", offset: int = 1) -> torch.Tensor:
    """Cross-entropy of each position's logits against the label ``offset`` positions on (-100 is ignored).
    ``reduction="sum"`` lets the trainer normalise over a whole batch split into microbatches.

    Bitwise ``F.cross_entropy(logits[:, :-offset].float(), labels[:, offset:])`` (``reference_causal_lm_loss``) in
    value and gradient, without its fp32 copy of the logits: llmfoundry.models.chunked_loss walks the vocabulary
    a chunk of rows at a time, and torch's nll_loss reduces the targets' log-probabilities as cross_entropy's would."""
    # the targets in the logits' own positions (the last ``offset`` have none), so that the logits are read in
    # place: slicing them first would copy all of them when B > 1
    targets = labels[:, offset:]
    padded = F.pad(targets, (0, offset), value=IGNORE_INDEX) if offset else targets
    picked = target_log_probs(logits, padded, IGNORE_INDEX)[:, :targets.size(1)]
    # nll_loss over one 'class' per row: the same kernel, values and order as cross_entropy's reduction
    classes = torch.where(targets == IGNORE_INDEX, targets, torch.zeros_like(targets))
    return F.nll_loss(picked.reshape(-1, 1), classes.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction)


def reference_causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean",
                             offset: int = 1) -> torch.Tensor:
    """``causal_lm_loss`` as plain F.cross_entropy on the upcast logits (what the chunked loss is checked against)."""
    logits, labels = _aligned(logits, labels, offset)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


def count_target_tokens(labels: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """The number of positions that carry a loss (what ``causal_lm_loss(..., "sum")`` is summed over)."""
    return (labels[:, offset:] != IGNORE_INDEX).sum()


def count_correct_tokens(logits: torch.Tensor, labels: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """How many target positions the model's argmax predicts right (llm-foundry's TokenAccuracy numerator)."""
    logits, targets = _aligned(logits, labels, offset)
    return ((logits.argmax(dim=-1) == targets) & (targets != IGNORE_INDEX)).sum()


@dataclass(frozen=True)
class TokenLoss:
    """The loss of one model's batches: ``causal_lm_loss`` and ``count_target_tokens`` at that model's offset."""

    offset: int = 1

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return causal_lm_loss(logits, labels, reduction, self.offset)

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        return count_target_tokens(labels, self.offset)


def aux_loss_sum(output: object, labels: torch.Tensor, loss: TokenLoss, on_tokens: bool) -> torch.Tensor | None:
    """A model's auxiliary training loss for one microbatch, weighted as the trainer weights that microbatch's
    cross-entropy sum, or None when the model has none. ``output.aux_loss`` (MoE: moe_loss_weight times the
    load-balancing loss) is a mean over the microbatch that llm-foundry adds to the microbatch's mean loss; times
    its target tokens (``on_tokens``: accumulate_train_batch_on_tokens) or its samples it joins the sum that the
    trainer divides by the whole batch's tokens or samples."""
    aux = getattr(output, "aux_loss", None)
    if aux is None:
        return None
    share = loss.targets(labels) if on_tokens else len(labels)
    return aux * share
