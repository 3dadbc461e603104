"""mbmoe_tok_per_expert (llm-foundry's MegaBlocksMoE_TokPerExpert): how evenly the MoE layers spread tokens.

Every ``log_interval`` batches it logs the minimum, maximum, median and standard deviation of the tokens each
expert received in the batch, over all layers (``mb_moe/all_layers_<stat>_tpe``) and, with ``log_every_layer``,
per layer (``mb_moe/layer<i>_<stat>_tpe``): llm-foundry's names. ``normalize`` divides a layer's counts by its
number of tokens (counts / (sum / top_k)), so a perfectly balanced layer shows top_k / experts for every expert.
The counts are this rank's training forwards of the batch (every microbatch), summed over ranks with
``all_reduce_stats``; the model counts them itself (``MPTForCausalLM.tokens_per_expert``).
"""

from __future__ import annotations

import torch

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.interface import ModelHooks, hooks_of
from llmfoundry.models.layers.moe import DroplessMoE
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import TokPerExpertSettings
from llmfoundry.train.state import TrainState


class TokPerExpert(Callback):
    def __init__(self, settings: TokPerExpertSettings):
        self.s = settings
        self.top_k: int | None = None
        self.counts: torch.Tensor | None = None  # (layers, experts) of the last logged batch, before normalize
        self.hooks = ModelHooks()  # the model's, from on_fit_start: its tokens-per-expert counter

    def on_fit_start(self, state: TrainState) -> None:
        moe = [m for m in state.model.modules() if isinstance(m, DroplessMoE)]
        self.hooks = hooks_of(state.model)
        if not moe or self.hooks.tokens_per_expert is None:
            raise ConfigError("callbacks.mbmoe_tok_per_expert: the model has no mixture-of-experts layers (set "
                              "model.ffn_config.ffn_type to mb_moe, mb_dmoe or torch_dmoe, or remove the callback)")
        self.top_k = moe[0].top_k

    def on_batch_start(self, state: TrainState) -> None:
        self.hooks.reset_tokens_per_expert()  # count this batch's forwards only

    def on_batch_end(self, state: TrainState, metrics) -> None:
        if state.time.batch % self.s.log_interval:
            return
        counts = self.hooks.tokens_per_expert()
        if counts is None:  # a skipped or empty batch: nothing was routed
            return
        counts = counts.detach().clone()  # (L, E)
        if self.s.all_reduce_stats:
            counts = dist.all_reduce_sum(counts)
        self.counts = counts
        values = counts.double()
        if self.s.normalize:
            values = values / (values.sum(dim=1, keepdim=True) / self.top_k).clamp(min=1)
        metrics.update(_stats("all_layers", values.flatten()))
        if self.s.log_every_layer:
            for i, layer in enumerate(values):
                metrics.update(_stats(f"layer{i}", layer))


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    return {
        f"mb_moe/{prefix}_min_tpe": float(values.min()),
        f"mb_moe/{prefix}_max_tpe": float(values.max()),
        f"mb_moe/{prefix}_median_tpe": float(values.median()),
        f"mb_moe/{prefix}_std_tpe": float(values.std()) if values.numel() > 1 else 0.0,
    }


def build_tok_per_expert(settings: TokPerExpertSettings) -> Callback:
    return TokPerExpert(settings)
