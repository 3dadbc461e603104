"""optimizer_monitor (Composer's OptimizerMonitor): L2 norms per parameter every ``batch_log_interval`` batches.

Metric names are Composer's, with Composer's parameter names (``model.`` + the name in the model, so an MPT's
``l2_norm/grad/model.transformer.blocks.0.attn.Wqkv.weight`` is the same series as in llm-foundry):

- ``l2_norm/grad/<param>``: the gradient after clipping (as the optimizer used it), and ``l2_norm/grad/global``;
- with ``log_optimizer_metrics`` and an Adam-family optimizer (decoupled_adamw, adamw): ``l2_norm/moment/<param>``
  (first moment), ``l2_norm/param/<param>`` and ``l2_norm/update/<param>`` (the step just applied: the Adam
  direction times the bias-corrected learning rate, plus the weight decay); with a Lion-family optimizer, moment and
  param (Composer's Lion reports those too).

Under FSDP, tensor or expert parallelism each rank holds parts of a DTensor; the squared norms are summed across
ranks, each part weighted by 1 / the number of ranks holding it, so every rank logs the full norms.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor, Replicate

from llmfoundry.core import dist
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.param_names import composer_name
from llmfoundry.train.callbacks.settings import OptimizerMonitorSettings
from llmfoundry.train.state import TrainState


class OptimizerMonitor(Callback):
    def __init__(self, settings: OptimizerMonitorSettings):
        self.s = settings

    def on_optimizer_step(self, state: TrainState, metrics):
        if (state.time.batch + 1) % self.s.batch_log_interval != 0:  # time.batch counts the batches before this
            return
        names: list[str] = []
        local: list[torch.Tensor] = []  # squared norms of this rank's part
        share: list[float] = []  # 1 / how many ranks hold each element (0: a plain tensor, not summed over ranks)
        optimizer = state.optimizer
        group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        for name, param in state.model.named_parameters():
            if param.grad is None or not param.requires_grad:
                continue
            values = {"grad": param.grad}
            if self.s.log_optimizer_metrics and param in optimizer.state:
                values.update(_optimizer_values(param, optimizer.state[param], group_of.get(id(param))))
            for kind, value in values.items():
                names.append(f"l2_norm/{kind}/{composer_name(name)}")
                is_dtensor = isinstance(value, DTensor)
                if is_dtensor and any(p.is_partial() for p in value.placements):
                    # a replicated weight used on sequence-parallel inputs (block TP's norms) has partial sums as
                    # its gradient until the optimizer combines them: sum them first (every rank, same order)
                    value = value.redistribute(value.device_mesh, [Replicate() if p.is_partial() else p
                                                                   for p in value.placements])
                part = value.to_local() if is_dtensor else value
                local.append(part.detach().float().pow(2).sum())
                share.append(_share(value) if is_dtensor and dist.world_size() > 1 else 0.0)
        if not names:
            return
        squares = torch.stack(local)
        weights = torch.tensor(share, device=squares.device)
        if bool((weights > 0).any()):  # one collective for all the DTensors; plain tensors are counted once
            squares = torch.where(weights > 0, dist.all_reduce_sum(squares * weights), squares)
        values = squares.tolist()
        grad_total = 0.0
        for name, square in zip(names, values):
            metrics[name] = math.sqrt(square)
            if name.startswith("l2_norm/grad/"):
                grad_total += square
        metrics["l2_norm/grad/global"] = math.sqrt(grad_total)


def _share(value: DTensor) -> float:
    """1 / the number of ranks holding each element of ``value``: the mesh dimensions it is sharded over split it,
    the others (replicated; and every rank outside its mesh, e.g. the other TP ranks of an FSDP-over-dp tensor)
    repeat it."""
    parts = math.prod(value.device_mesh.size(dim) for dim, placement in enumerate(value.placements)
                      if not placement.is_replicate())
    return parts / dist.world_size()


def _optimizer_values(param: torch.Tensor, state: dict, group: dict | None) -> dict[str, torch.Tensor]:
    """The moment and parameter, and for Adam the update just applied, as Composer's optimizers report them."""
    if "exp_avg" not in state:
        return {}
    values = {"moment": state["exp_avg"], "param": param.detach()}
    if "exp_avg_sq" in state and group is not None:
        beta1, beta2 = group["betas"]
        step = float(state["step"])
        denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(group["eps"])
        update = state["exp_avg"] / denom * (group["lr"] / (1 - beta1**step))
        # torch's AdamW decays by lr x weight_decay (decoupled_adamw stores its weight decay divided by lr_0)
        values["update"] = update.add_(param.detach(), alpha=group["lr"] * group["weight_decay"])
    return values


def build_optimizer_monitor(settings: OptimizerMonitorSettings) -> Callback:
    return OptimizerMonitor(settings)
