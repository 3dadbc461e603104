"""Mixture-of-experts FFN: llm-foundry's ``mb_moe``, ``mb_dmoe`` and ``torch_dmoe``, one dropless implementation.

    x -> router (softmax over experts, top-k) -> rows sorted by expert -> each expert's FFN (grouped matmuls)
      -> outputs weighted by the router and summed back per token

Every token reaches all of its top-k experts (no capacity, nothing dropped). The experts' weights are stacked
tensors with the experts first, ``w1``/``v1``/``w2`` of shape (experts, ffn_hidden_size, d_model): llm-foundry's
torch_dmoe layout (its (experts * ffn_hidden_size, d_model) matrices, one row block per expert), so FSDP2 shards
whole experts along dim 0 and a checkpoint's matrices map onto these by a reshape. Parameter names follow
llm-foundry/MegaBlocks: ``router.layer.weight``, ``experts.mlp.w1``/``v1``/``w2``, ``experts.bias``.

The experts run as ``torch._grouped_mm`` where the device and dtype support it (CPU: float32/bf16/fp16 with
16-byte aligned rows; CUDA: bf16 on sm90+; under torch.compile: bf16), else as one matmul per expert (a
graph break under torch.compile: it reads the counts); both compute the same products.

The load-balancing loss is MegaBlocks' (``batched_load_balancing_loss``): over the L MoE layers of a forward,
``E / (L * N * k) * sum_l sum_e tokens_l[e] * mean_score_l[e]`` (N tokens, top-k, E experts), so a router that
spreads its probability and its tokens evenly scores exactly 1.0; the training loss adds ``moe_loss_weight`` times
it (``moe_loss_weight`` is part of MegaBlocks' value; here :func:`load_balancing_loss` returns the unweighted one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmfoundry.core.dist import local_tensor
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.layers.ffn import build_activation
from llmfoundry.models.layers.init import init_module
from llmfoundry.models.layers.moe_keys import MEGABLOCKS_ACT_FN, MEGABLOCKS_TYPES, is_moe

RoutingStats = tuple  # (tokens_per_expert (E,) int64, mean router probability per expert (E,)), one MoE layer


class LearnedRouter(nn.Module):
    """Token -> (probabilities over experts, the top-k experts' weights, the top-k experts), as MegaBlocks routes."""

    def __init__(self, d_model: int, f: Any):
        super().__init__()
        self.num_experts, self.top_k = f.moe_num_experts, f.moe_top_k
        self.jitter_eps, self.normalize = f.moe_jitter_eps, f.moe_normalize_expert_weights
        self.uniform = f.uniform_expert_assignment
        self.layer = nn.Linear(d_model, self.num_experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # x: (N, d)
        if self.training and self.jitter_eps:  # multiplicative noise on the router's input only
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter_eps, 1.0 + self.jitter_eps)
        scores = self.layer(x).softmax(dim=-1)  # (N, E)
        weights, experts = scores.topk(self.top_k, dim=-1)  # (N, k) each
        if self.normalize:
            weights = weights / weights.norm(p=self.normalize, dim=-1, keepdim=True)
        if self.uniform:  # benchmarking: token i's j-th choice is expert (i * k + j) mod E, the router still runs
            experts = torch.arange(experts.numel(), device=x.device).remainder(self.num_experts).view_as(experts)
        return scores, weights, experts


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: _grouped_mm's backward on CPUs refuses the
    stride-0 gradients that e.g. ``out.sum()`` produces."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs (x: (M, a), w: (E, a, b)) on this device and dtype."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        return False  # torch.compile traces it with CUDA's rule (bf16 only), whatever the device
    align = 16 // x.element_size()  # every row of every operand and of the output starts on 16 bytes
    if w.shape[1] % align or w.shape[2] % align:
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return False


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, grouped: bool | None = None) -> torch.Tensor:
    """Rows grouped by expert times that expert's matrix: x (M, a) with counts[e] rows for expert e, w (E, a, b)
    -> (M, b). ``grouped``: force (True) or avoid (False) ``torch._grouped_mm``; None decides by device and dtype."""
    if grouped is None:
        grouped = grouped_mm_supported(x, w)
    if grouped:
        offsets = counts.cumsum(0).to(torch.int32)  # end row of each expert's group
        return _ContiguousGrad.apply(torch._grouped_mm(x, w, offs=offsets))
    rows = x.split(counts.tolist())  # one host sync per call: the exact fallback, not the fast path
    return torch.cat([part @ w[e] for e, part in enumerate(rows)])


class ExpertMLP(nn.Module):
    """E FFNs (MLP or GLU) of width ffn_hidden_size as stacked weights: w1, v1 (GLU) and w2, each (E, h, d)."""

    def __init__(self, d_model: int, hidden: int, num_experts: int, glu: bool, act: nn.Module):
        super().__init__()
        self.d_model, self.hidden, self.num_experts, self.glu = d_model, hidden, num_experts, glu
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, d_model))  # up: y = x @ w1[e].T
        if glu:
            self.v1 = nn.Parameter(torch.empty(num_experts, hidden, d_model))  # gated up: act(x @ w1.T) * x @ v1.T
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, d_model))  # down: y = h @ w2[e]
        self.act = act
        self.grouped: bool | None = None  # None: torch._grouped_mm where supported; tests force either path

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:  # x: (M, d) grouped by expert
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        x = x.to(dtype)  # autocast does not cover _grouped_mm: cast as F.linear would
        # local_tensor: under expert parallelism (models/mpt/expert_parallel.py) the weights are split by expert
        # across ranks and x holds the rows of this rank's experts; counts then has one entry per local expert
        h = self.act(grouped_matmul(x, local_tensor(self.w1).to(dtype).transpose(1, 2), counts, self.grouped))  # (M, h)
        if self.glu:
            h = h * grouped_matmul(x, local_tensor(self.v1).to(dtype).transpose(1, 2), counts, self.grouped)
        return grouped_matmul(h, local_tensor(self.w2).to(dtype), counts, self.grouped)  # (M, d)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, d_model={self.d_model}, hidden={self.hidden}, glu={self.glu}"


class Experts(nn.Module):
    """The experts and the output bias MegaBlocks adds after combining them (mb_* types with biases)."""

    def __init__(self, mlp: ExpertMLP, bias: bool):
        super().__init__()
        self.mlp = mlp
        self.bias = nn.Parameter(torch.empty(mlp.d_model)) if bias else None


class DroplessMoE(nn.Module):
    """(B, T, d) -> ((B, T, d), RoutingStats): each token through its top-k experts, weighted by the router."""

    def __init__(self, arch: Any):
        super().__init__()
        f = arch.ffn_config
        default_act = MEGABLOCKS_ACT_FN if f.ffn_type in MEGABLOCKS_TYPES else None  # torch_dmoe: exact gelu
        act = build_activation(f.ffn_act_fn or default_act, f.ffn_type)
        self.num_experts, self.top_k = f.moe_num_experts, f.moe_top_k
        self.router = LearnedRouter(arch.d_model, f)
        mlp = ExpertMLP(arch.d_model, arch.ffn_hidden, f.moe_num_experts, f.mlp_type == "glu", act)
        # MegaBlocks' output bias; llm-foundry's torch_dmoe has none
        self.experts = Experts(mlp, bias=f.ffn_type in MEGABLOCKS_TYPES and not arch.no_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RoutingStats]:
        shape, k = x.shape, self.top_k
        x = x.reshape(-1, shape[-1])  # (N, d)
        scores, weights, experts = self.router(x)  # (N, E), (N, k), (N, k)
        choice = experts.reshape(-1)  # (N * k,): the expert of token n's j-th choice at n * k + j
        order = choice.argsort(stable=True)  # choices grouped by expert, tokens in order within a group
        # (E,) tokens per expert (not bincount, whose output size depends on the data, which torch.compile avoids)
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=x.device)
        counts = counts.index_add_(0, choice, torch.ones_like(choice))
        token = order // k  # the token of each grouped row
        y = self.experts.mlp(x[token], counts)  # (N * k, d)
        y = y * weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros(x.shape, dtype=y.dtype, device=y.device).index_add_(0, token, y)  # (N, d)
        if self.experts.bias is not None:
            out = out + self.experts.bias.to(out.dtype)
        return out.view(shape), (counts, scores.mean(dim=0))


def build_moe(arch: Any) -> DroplessMoE:
    return DroplessMoE(arch)


def load_balancing_loss(routing: list[RoutingStats], num_tokens: int, top_k: int, in_fp32: bool) -> torch.Tensor:
    """MegaBlocks' batched load-balancing loss without its moe_loss_weight factor: 1.0 when every layer's router
    probabilities and token counts are uniform over the experts. ``in_fp32``: moe_lbl_in_fp32 (else the product
    is taken in the router probabilities' dtype, as MegaBlocks does)."""
    counts = torch.cat([c for c, _ in routing])  # (L * E,)
    scores = torch.cat([s for _, s in routing])
    dtype = torch.float32 if in_fp32 else scores.dtype
    num_experts = routing[0][0].numel()
    scale = num_experts / (len(routing) * num_tokens * top_k)
    return scale * torch.dot(counts.to(dtype), scores.to(dtype))


@torch.no_grad()
def init_experts(module: nn.Module, arch: Any) -> None:
    """Expert-aware init of the parameters ``module`` owns directly: each expert's w1/v1 like a dense FFN's
    up_proj (fan-in d_model) and its w2 like a dense down_proj (fan-in ffn_hidden_size, scaled as a residual
    output), drawn through the same ``init_module`` as the dense layers; the output bias starts at zero."""
    if isinstance(module, Experts) and module.bias is not None:
        nn.init.zeros_(local_tensor(module.bias))
    if not isinstance(module, ExpertMLP):
        return
    for name in ("w1", "v1", "w2"):
        if not hasattr(module, name):
            continue
        local = local_tensor(getattr(module, name))  # FSDP2 shards dim 0: whole experts on each rank
        for e in range(local.shape[0]):
            dense = nn.Linear(*((module.hidden, module.d_model) if name == "w2" else (module.d_model, module.hidden)),
                              bias=False, device=local.device, dtype=local.dtype)
            dense._is_residual = name == "w2"
            init_module(dense, arch)
            local[e].copy_(dense.weight.T if name == "w2" else dense.weight)  # w2[e] is down_proj.weight.T


def expert_weight_from_llm_foundry(name: str, tensor: torch.Tensor, ffn_type: str | None, shape: Any,
                                   where: str = "") -> torch.Tensor:
    """One tensor of llm-foundry's MoE MPT (a weight, or optimizer state of its shape such as exp_avg) in our
    layout: ``shape`` is our parameter's, (E, ffn_hidden_size, d_model). Identity for anything but an expert matrix.

    llm-foundry's layouts: mb_dmoe (MegaBlocks' SparseMLP/SparseGLU and their grouped versions) and torch_dmoe hold
    w1, v1, w2 flat, (E * ffn_hidden_size, d_model), one row block per expert: ours by a reshape. mb_moe (MegaBlocks'
    MLP, batched matmuls ``bmm(act(bmm(x, w1)), w2)``) holds w1 as (E, d_model, ffn_hidden_size): ours is its
    transpose (v1 taken alike, though MegaBlocks' mb_moe experts are always MLPs); its w2 is ours as it is. When
    ffn_hidden_size == d_model the shapes cannot tell the layouts apart, so the ffn_type decides, never the shape.
    A tensor of another size is a ConfigError naming it (``where`` says which checkpoint)."""
    kind = name.rsplit(".", 1)[-1]
    if not is_moe(ffn_type or "") or kind not in ("w1", "v1", "w2") or not f".{name}".endswith(f".experts.mlp.{kind}"):
        return tensor
    experts, hidden, d_model = (int(n) for n in shape)
    if ffn_type == "mb_moe":
        layout = (experts, d_model, hidden) if kind != "w2" else (experts, hidden, d_model)
    else:
        layout = (experts * hidden, d_model)
    if tuple(tensor.shape) != layout:
        raise ConfigError(f"{where}{' ' if where else ''}'{name}' has shape {tuple(tensor.shape)}, llm-foundry's "
                          f"{ffn_type} layout for this model ({experts} experts, ffn_hidden_size {hidden}, d_model "
                          f"{d_model}) is {layout}; the checkpoint's model differs from the one it is loaded into")
    if ffn_type == "mb_moe" and kind != "w2":
        return tensor.transpose(1, 2).contiguous()
    return tensor.reshape(experts, hidden, d_model)


def active_share(param_name: str, ffn_config: Any) -> float:
    """The fraction of a parameter one token uses: top_k / experts for expert weights, 1 for the rest (the router
    included), for FLOPs per token."""
    if is_moe(ffn_config.ffn_type) and ".experts.mlp." in f".{param_name}":
        return ffn_config.moe_top_k / ffn_config.moe_num_experts
    return 1.0
