"""MPT's tensor-parallel plan (``tp_config``, with ``torch.distributed.tensor.parallel``): ``MPTTensorParallel``,
which the model declares in its hooks (models/interface.TensorParallelPlan).

The trainer lays the ranks out on a 2-D ``(dp, tp)`` mesh (train/layouts.py) and hands this plan the tp dimension.
The ranks of one TP group compute on the SAME microbatch (llm-foundry's ``ffn`` plan instead feeds each TP rank its
own samples and gathers them along the batch dimension before the FFN; replicated inputs give the same sums
without the gather, and are what attention needs). TP is applied first, then FSDP2 shards over the ``dp``
dimension (torchtitan's order), so a block's parameters are 2-D DTensors (Shard(0) on dp; tp: as the plan says).

Strategies (of each block; embeddings, the final norm and the output head stay replicated on every TP rank):

=======  ==================================================================================================
ffn      llm-foundry's: ``ffn.up_proj`` (and ``gate_proj``) column-parallel, ``ffn.down_proj`` row-parallel
         (one all-reduce of the FFN output per block)
block    also attention: ``q_proj`` / ``k_proj`` / ``v_proj`` column-parallel (each rank computes
         ``n_heads / tp`` query and ``kv_heads / tp`` key/value heads), ``out_proj`` row-parallel; the
         residual stream inside the block is split along the sequence (sequence parallelism), so ``norm_1`` /
         ``norm_2`` run on ``T / tp`` positions per rank; the block's output is gathered again (all-gather).
=======  ==================================================================================================

With ``block`` the model's input is padded at the end to a multiple of the degree (``_PadSequence``): the
sequence-parallel parts must be equal on every rank.

``block`` needs ``attn_config.fused_qkv: false``: a column split of the fused Wqkv would hand rank 0 all the q
columns and rank 1 the k|v ones; re-ordering its rows per rank would make the checkpoint's Wqkv depend on the TP
degree. Neither ALiBi nor qk_ln (a norm over all heads) is split yet: refused with ``block``. MoE FFNs: refused.

Every collective used (all-reduce, all-gather, reduce-scatter of DTensor redistribution) exists in gloo, so CPU
runs are exact tests of the same code.

Dropout: the trainer must seed the ranks of a TP group alike (the replicated parts must draw the same masks); the
sharded parts (attention heads, out_proj / down_proj outputs split along the sequence) then draw masks of the same
RNG stream on each rank, so with ``block`` the masks of matching heads / positions repeat across TP ranks.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.layers.ffn import MPTGLU
from llmfoundry.models.layers.positional import token_positions
from llmfoundry.models.mpt.arch import MPTArch


class MPTTensorParallel:
    """The ``ffn`` and ``block`` strategies above, for a model of architecture ``arch``."""

    def __init__(self, arch: MPTArch):
        self.arch = arch

    def check(self, degree: int, strategy: str) -> None:
        """One-line ConfigErrors for what this plan cannot split exactly."""
        arch = self.arch
        f, a = arch.ffn_config, arch.attn_config
        if f.ffn_type not in ("mptmlp", "mptglu"):
            raise ConfigError(f"tp_config: ffn_config.ffn_type: {f.ffn_type} (mixture of experts) has no "
                              "tensor-parallel plan yet (remove tp_config)")
        if arch.ffn_hidden % degree:
            raise ConfigError(f"tp_config.tensor_parallel_degree: {degree} does not divide the FFN width "
                              f"{arch.ffn_hidden}")
        if strategy != "block":
            return
        if a.fused_qkv:
            raise ConfigError("tp_config.strategy: block splits q/k/v by head; set model.attn_config.fused_qkv: "
                              "false (a column split of the fused Wqkv would mix q, k and v across ranks)")
        for name, heads in (("n_heads", arch.n_heads), ("kv heads", arch.kv_heads)):
            if heads % degree:
                raise ConfigError(f"tp_config.tensor_parallel_degree: {degree} does not divide the model's {name} "
                                  f"({heads}); use a divisor of it, or strategy: ffn")
        if a.alibi or a.qk_ln:
            raise ConfigError("tp_config.strategy: block does not split ALiBi biases or qk_ln (a norm over all "
                              "heads) yet; use strategy: ffn")

    def prepare_model(self, model: nn.Module, degree: int, strategy: str) -> None:
        """With ``block``: the model's inputs padded to a multiple of the degree (see _PadSequence)."""
        if strategy != "block":
            return
        padding = _PadSequence(degree)
        model.transformer.register_forward_pre_hook(padding.pad, with_kwargs=True)
        model.transformer.register_forward_hook(padding.cut, with_kwargs=True)

    def parallelize_block(self, block: nn.Module, mesh: DeviceMesh, strategy: str) -> None:
        """Shard one block's projections over ``mesh`` in place (the trainer calls it on each block of a meta model
        as soon as that block is materialised, so that no rank ever holds the whole model)."""
        if strategy == "ffn":
            parallelize_module(block, mesh, ffn_plan(block.ffn))
            return
        # The residual stream enters replicated; each rank keeps its T / tp positions (a slice, no communication)
        # and the block's output is all-gathered back, so everything outside the blocks is unchanged.
        parallelize_module(block, mesh, PrepareModuleInputOutput(
            input_layouts=(Replicate(), None, None, None), desired_input_layouts=(Shard(1), None, None, None),
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_input=True,
            use_local_output=True))
        parallelize_module(block, mesh, block_plan(block))


class _PadSequence:
    """Pads the MPT's input on the right to a multiple of the TP degree, and cuts its output back.

    With ``block`` each block's positions are split evenly over the TP ranks, and torch's sequence-parallel hooks
    make DTensors of the local parts without a global shape, so every rank must hold the same number: T = 7 on two
    ranks (4 and 3) would make the ranks disagree about the length and the gather fail (or hang on NCCL). ICL
    batches, unpadded text rows and generation steps (T = 1) have such lengths. Positions added at the end change
    nothing before them (causal attention); they are padded as real tokens (id 0, attention mask 1, the last
    document's sequence_id, the last position), their outputs are dropped, and a KV cache is cropped back to the
    real positions."""

    def __init__(self, degree: int):
        self.degree = degree
        self.calls: list[tuple[int, int, object]] = []  # (T, positions cached before, cache) per open forward

    def pad(self, module: nn.Module, args: tuple, kwargs: dict):
        values = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        input_ids, cache = values["input_ids"], values.get("cache")
        length = input_ids.shape[1]
        self.calls.append((length, cache.get_seq_length() if cache is not None else 0, cache))
        extra = -length % self.degree
        if extra == 0:
            return None

        def grow(t, fill):  # (B, n) -> (B, n + extra); fill: the values of the new columns, (B, extra)
            return torch.cat([t, fill.to(t.dtype)], dim=1)

        rows = input_ids.shape[0]
        if values.get("position_ids") is None:  # the model's own positions, so that the padding's can repeat them
            values["position_ids"] = token_positions(rows, length, self.calls[-1][1], values.get("attention_mask"),
                                                     input_ids.device)
        values["input_ids"] = grow(input_ids, torch.zeros(rows, extra, device=input_ids.device))
        # the padding repeats the last position: a learned position table has no row past max_seq_len
        for key, fill in (("attention_mask", lambda t: torch.ones(rows, extra, device=t.device)),
                          ("sequence_id", lambda t: t[:, -1:].expand(rows, extra)),
                          ("position_ids", lambda t: t[:, -1:].expand(rows, extra))):
            if values.get(key) is not None:
                values[key] = grow(values[key], fill(values[key]))
        return (), values

    def cut(self, module: nn.Module, args, kwargs, output: torch.Tensor) -> torch.Tensor:
        length, past, cache = self.calls.pop()
        if cache is not None and cache.get_seq_length() > past + length:
            cache.crop(past + length - cache.get_seq_length())  # transformers 5 crops by a negative count
        return output[:, :length]


def ffn_plan(ffn: nn.Module, prefix: str = "ffn.", output=None) -> dict:
    """Column-parallel up (and gate) projection, row-parallel down projection: one all-reduce (or reduce-scatter
    along the sequence, ``output=Shard(1)``) of the FFN output."""
    plan = {f"{prefix}up_proj": ColwiseParallel(),
            f"{prefix}down_proj": RowwiseParallel(output_layouts=output or Replicate())}
    if isinstance(ffn, MPTGLU):
        plan[f"{prefix}gate_proj"] = ColwiseParallel()
    return plan


def block_plan(block: nn.Module) -> dict:
    """Attention by heads, FFN by columns, norms along the sequence (the block's input arrives replicated and is
    split along T by the block's own input hook; see MPTTensorParallel.parallelize_block)."""
    seq, rep = Shard(1), Replicate()
    plan = {
        "norm_1": SequenceParallel(),
        # attn(x, mask, rope, cache): only x is a tensor to redistribute (the sequence is gathered for attention)
        "attn": PrepareModuleInput(input_layouts=(seq, None, None, None),
                                   desired_input_layouts=(rep, None, None, None)),
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.out_proj": RowwiseParallel(output_layouts=seq),
        "norm_2": SequenceParallel(),
        "ffn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(rep,)),
    }
    plan.update(ffn_plan(block.ffn, output=seq))
    return plan
