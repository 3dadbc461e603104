"""Language-modelling metrics with llm-foundry's names, shared by training batches, eval loaders and eval recipes.

llm-foundry registers its metrics under these names (``llmfoundry.metrics``) and logs them by class name:

=========================  ========================  ==============================================================
registered name            logged as                 value over a batch (or a whole eval loader)
=========================  ========================  ==============================================================
``language_cross_entropy``  ``LanguageCrossEntropy``  summed next-token loss / target tokens (labels != -100)
``language_perplexity``     ``LanguagePerplexity``    exp(LanguageCrossEntropy)
``token_accuracy``          ``TokenAccuracy``         target tokens the argmax predicts / target tokens
``masked_accuracy``         ``MaskedAccuracy``        Composer's: the same count as TokenAccuracy on causal LMs
=========================  ========================  ==============================================================

A model's ``use_train_metrics`` (default true, as llm-foundry) logs the defaults (``language_cross_entropy``,
``language_perplexity``, ``token_accuracy``) and ``additional_train_metrics`` on every training batch as
``metrics/train/<Name>``, computed from the training forward pass itself (dropout on), as Composer does. Every
sum is taken over the whole global batch: all microbatches and all ranks. The names and those keys
(``MetricSettings``) are in models/settings.py, which the recipe schema reads without torch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from llmfoundry.core import dist
from llmfoundry.models.loss import causal_lm_loss, count_correct_tokens, count_target_tokens
from llmfoundry.models.settings import DEFAULT_METRICS, LANGUAGE_METRICS


def _setting(model_settings: Any, key: str, default: Any) -> Any:
    """A key of validated settings or of a plain model section (a plugin model's settings may lack it)."""
    if isinstance(model_settings, dict):
        return model_settings.get(key, default)
    return getattr(model_settings, key, default)


def train_metric_names(model_settings: Any) -> list[str]:
    """The metrics a recipe's model section asks for on training batches ([] when use_train_metrics is false)."""
    if not _setting(model_settings, "use_train_metrics", True):
        return []
    return _language_only([*DEFAULT_METRICS, *(_setting(model_settings, "additional_train_metrics", None) or [])])


def eval_metric_names(model_settings: Any) -> list[str]:
    """The metrics of eval loaders: the defaults and both lists of additional metrics."""
    extra = [*(_setting(model_settings, "additional_train_metrics", None) or []),
             *(_setting(model_settings, "additional_eval_metrics", None) or [])]
    return _language_only([*DEFAULT_METRICS, *extra])


def _language_only(names: list[str]) -> list[str]:
    return [n for n in dict.fromkeys(names) if n in LANGUAGE_METRICS]


class LanguageMetrics:
    """Sums of one batch or one eval pass (loss, target tokens, argmax matches), reduced over ranks on compute.

    ``update`` takes a microbatch's logits and labels (-100 = no target; ``offset`` as in llmfoundry.models.loss: 1
    for a causal LM's unshifted labels, 0 for an encoder-decoder's); pass its summed loss when it is already
    computed, so the cross-entropy is not computed twice."""

    def __init__(self, names: list[str], device: torch.device | str, offset: int = 1):
        self.names = list(names)
        self.device = torch.device(device)
        self.offset = offset
        self.reset()

    def reset(self) -> None:
        # loss, target tokens, correct tokens (float64: exact token counts over long eval passes)
        self.sums = torch.zeros(3, device=self.device, dtype=torch.float64)

    def __bool__(self) -> bool:
        return bool(self.names)

    @torch.no_grad()
    def update(self, logits: torch.Tensor, labels: torch.Tensor, loss_sum: torch.Tensor | None = None) -> None:
        if loss_sum is None:
            loss_sum = causal_lm_loss(logits, labels, reduction="sum", offset=self.offset)
        counts = torch.stack([loss_sum.detach().double(), count_target_tokens(labels, self.offset).double(),
                              count_correct_tokens(logits, labels, self.offset).double()])
        self.sums += counts.to(self.device)

    def target_tokens(self) -> float:
        """Target tokens seen on every rank together."""
        return float(dist.all_reduce_sum(self.sums.clone())[1])

    def compute(self, prefix: str) -> dict[str, float]:
        """``{prefix}/{Name}`` for every metric (sums over every rank; a collective call when distributed)."""
        if not self.names:
            return {}
        return self.values(prefix, *(float(v) for v in dist.all_reduce_sum(self.sums.clone())))

    def values(self, prefix: str, loss: float, tokens: float, correct: float) -> dict[str, float]:
        """The metrics from sums already reduced over ranks (the trainer reads them at log intervals)."""
        tokens = max(tokens, 1.0)
        cross_entropy = loss / tokens
        values = {
            "language_cross_entropy": cross_entropy,
            "language_perplexity": math.exp(min(cross_entropy, 700.0)),
            "token_accuracy": correct / tokens,
            "masked_accuracy": correct / tokens,
        }
        return {f"{prefix}/{LANGUAGE_METRICS[n]}": values[n] for n in self.names}
