"""MPT's expert-parallel plan (``model.ffn_config.moe_world_size``) for its mixture-of-experts FFNs:
``MPTExpertParallel``, which the model declares in its hooks (models/interface.ExpertParallelPlan).

The trainer lays the ranks out on a 2-D ``(edp, ep)`` mesh (train/layouts.py): ``ep = moe_world_size`` consecutive
ranks share one set of experts, each keeping ``experts / ep`` of them whole (the stacked ``w1``/``v1``/``w2``
become DTensors sharded along the expert dimension); ``edp = world / ep`` groups hold copies, which FSDP2 shards
over the ``edp`` dimension (the composition TP + FSDP2 uses). Every rank still trains on its own samples.

In each MoE layer the rows that the router sent to another rank's experts travel there and back by all-to-all
(hooks around ``ExpertMLP``, so the model code stays the same on one rank):

    rows grouped by expert -> all_to_all (counts, then rows) -> rows of my experts, regrouped by expert
      -> my experts' FFNs -> rows back in arrival order -> all_to_all back -> rows grouped by expert as before

Gradients: an expert's gradient gathers the contributions of every rank of its ``ep`` group (the all-to-all's
backward), and FSDP2 then averages over ``edp``; the trainer scales each rank's loss by the world size (for FSDP's
average over all ranks), so the experts' gradients come out ``ep`` times too large. The rows entering the experts
carry their gradient times ``ep`` and the experts' output its gradient divided by ``ep`` (exact for powers of
two): the experts' weights get 1/ep of it, everything before them the gradient unchanged. (FSDP2's
``set_gradient_divide_factor`` would say the same, but needs a PREMUL_SUM reduction, which gloo lacks.)

gloo has every collective used (all_to_all with uneven splits included), so CPU runs test the same code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import all_to_all_single as all_to_all_counts
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from llmfoundry.models.layers.moe import DroplessMoE, ExpertMLP


class MPTExpertParallel:
    """Experts split over ``degree`` ranks (``moe_world_size``), rows routed to them by all-to-all."""

    def __init__(self, degree: int):
        self.degree = degree

    def parallelize_block(self, block: nn.Module, mesh: DeviceMesh) -> None:
        """Split each MoE layer's experts over ``mesh`` (the ep dimension) and route rows to them by all-to-all.
        ``block``: one block, or a whole model (the trainer calls it on each block of a meta model as soon as that
        block is materialised, so that no rank ever holds all the experts of every layer)."""
        for module in block.modules():
            if not isinstance(module, ExpertMLP):
                continue
            for name, param in list(module.named_parameters(recurse=False)):
                sharded = distribute_tensor(param.detach(), mesh, [Shard(0)])
                module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            route = _Routing(mesh.get_group(), module.num_experts)
            module.register_forward_pre_hook(route.dispatch)
            module.register_forward_hook(route.combine)

    def expert_modules(self, block: nn.Module) -> list[nn.Module]:
        """The stacked expert matrices of each MoE layer of ``block`` (the output bias stays with the block: one copy,
        averaged as usual)."""
        return [module.experts.mlp for module in block.modules() if isinstance(module, DroplessMoE)]


class _Routing:
    """The all-to-all around one ExpertMLP: ``dispatch`` (forward pre-hook) sends each row to the rank holding its
    expert, ``combine`` (forward hook) brings the results back. What combine needs is stacked (a re-run forward
    under activation checkpointing pushes and pops its own entry)."""

    def __init__(self, group, num_experts: int):
        self.group, self.ranks = group, group.size()
        self.local = num_experts // self.ranks
        self.pending: list[tuple[torch.Tensor, list[int], list[int]]] = []

    def dispatch(self, module: nn.Module, args: tuple) -> tuple:
        x, counts = args  # (M, d) rows grouped by expert; (E,) rows per expert
        send = counts.view(self.ranks, self.local)  # rows for each rank's experts
        received = torch.empty_like(send)  # received[s, e]: rows rank s sends to my e-th expert
        all_to_all_counts(received, send, group=self.group)
        to_each, from_each = send.sum(1).tolist(), received.sum(1).tolist()
        rows = _exchange(x, from_each, to_each, self.group)
        # rows arrive by source rank, then expert: regroup them by expert (sources in rank order within an expert)
        expert_of_block = torch.arange(self.local, device=x.device).repeat(self.ranks)
        expert_of_row = expert_of_block.repeat_interleave(received.flatten().to(x.device))
        order = expert_of_row.argsort(stable=True)
        self.pending.append((order, to_each, from_each))
        return _ScaleGrad.apply(rows[order], float(self.ranks)), received.sum(0)

    def combine(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        order, to_each, from_each = self.pending.pop()
        arrival = torch.empty_like(order)
        arrival[order] = torch.arange(order.numel(), device=order.device)
        back = _ScaleGrad.apply(output, 1.0 / self.ranks)[arrival]  # rows in arrival order, i.e. by source rank
        return _exchange(back, to_each, from_each, self.group)


class _ScaleGrad(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def _exchange(rows: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
    """All-to-all of ``rows`` (send[r] of them to rank r, receive[r] from it), differentiable (its backward is the
    reverse exchange)."""
    out = all_to_all_single_autograd(rows.contiguous(), receive, send, group)
    return out.wait() if hasattr(out, "wait") else out
