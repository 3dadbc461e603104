"""What the trainer needs from a model: the ``CausalLM`` protocol.

Every model builder registered in ``registry.models`` returns an ``nn.Module`` that has these members; the
trainer, the parallelism code and the callbacks use them directly, never by probing with ``getattr``. Our MPT
(``models.mpt``) and the transformers wrapper (``models.hf``) implement it; a plugin model does too, and
``check_causal_lm`` names what one lacks when it is built.

Two members are optional: ``is_encoder_decoder = True`` marks a model whose forward also takes the batch's
``decoder_input_ids``/``decoder_attention_mask`` and whose logits are scored against ``labels`` without a shift
(``hf_t5``); ``label_offset`` reads it, so decoder-only plugin models need not declare it. ``model_hooks()``
returns the model's :class:`ModelHooks`: what initialisation, parallelism and checkpoints need beyond the
protocol (how to initialise a meta model, where pretrained weights come from, what to recompute in backward, how
its blocks and experts split over ranks, ...).
train/ reads them through :func:`hooks_of` and never probes a model's attributes itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


class TensorParallelPlan(Protocol):
    """How a model's blocks split over the ranks of a tensor-parallel group (``tp_config``). The trainer builds
    the (dp, tp) mesh and checks the layout against the world size; the plan knows the model's layers."""

    def check(self, degree: int, strategy: str) -> None:
        """Raise a one-line ConfigError for what this plan cannot split exactly (``tp_config.strategy``)."""
        ...

    def prepare_model(self, model: nn.Module, degree: int, strategy: str) -> None:
        """Whatever the whole model needs before its blocks are split (e.g. inputs padded to the degree)."""
        ...

    def parallelize_block(self, block: nn.Module, mesh: Any, strategy: str) -> None:
        """Split one whole (materialised) block over ``mesh`` (the tp dimension) in place."""
        ...


class ExpertParallelPlan(Protocol):
    """How a mixture-of-experts model splits its experts over an expert-parallel group (``moe_world_size``)."""

    #: ranks that share one set of experts (1: no expert parallelism)
    degree: int

    def parallelize_block(self, block: nn.Module, mesh: Any) -> None:
        """Split the experts of one whole block over ``mesh`` (the ep dimension) and route rows to them."""
        ...

    def expert_modules(self, block: nn.Module) -> list[nn.Module]:
        """The modules holding a block's experts, which FSDP2 shards over the expert-data-parallel dimension."""
        ...


@dataclass(frozen=True)
class ModelHooks:
    """What a model declares for initialisation, parallelism and checkpoints (``model_hooks()``); every field is
    optional, and a model that declares nothing gets these defaults."""

    #: (re)initialise every parameter once a meta-device model has storage (init_device: meta)
    init_parameters: Callable[[], None] | None = None
    #: initialise one module (transformers' ``_init_weights``): what pretrained files lack, in a meta build
    init_module: Callable[[nn.Module], None] | None = None
    #: where a meta-built model's pretrained weights are read from after sharding (models/pretrained_weights.py)
    pretrained_weights: Any = None
    #: the modules recomputed in backward under activation checkpointing (None: every block)
    checkpoint_targets: list[nn.Module] | None = None
    #: checkpoints hold only the trained adapters (peft's should_save_peft_only); the frozen base is not saved
    saves_adapters_only: bool = False
    #: the output head shares the token embedding's weight (Composer's checkpoints then have no lm_head.weight)
    tie_word_embeddings: bool = False
    #: how the blocks split under ``tp_config`` (None: the model has no tensor-parallel plan)
    tensor_parallel: TensorParallelPlan | None = None
    #: how the experts split under ``moe_world_size`` (None: the model has no experts)
    expert_parallel: ExpertParallelPlan | None = None
    #: MoE models: the ffn_type whose expert matrices llm-foundry's (Composer's) checkpoints lay out their own way
    moe_ffn_type: str | None = None
    #: MoE models: tokens routed to each expert of each layer since the last reset, as a (layers, experts) tensor
    tokens_per_expert: Callable[[], torch.Tensor | None] | None = None
    #: MoE models: start counting tokens per expert anew
    reset_tokens_per_expert: Callable[[], None] | None = None


def hooks_of(model: Any) -> ModelHooks:
    """The hooks ``model`` declares (its optional ``model_hooks()``), or the defaults."""
    declare = getattr(model, "model_hooks", None)
    return declare() if callable(declare) else ModelHooks()


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` declared itself an encoder-decoder model (the optional member above)."""
    return bool(getattr(model, "is_encoder_decoder", False))


def label_offset(model: Any) -> int:
    """How far ahead of a logit its label sits (llmfoundry.models.loss): 1 for causal LMs, 0 for encoder-decoder."""
    return 0 if is_encoder_decoder(model) else 1


def context_length(model) -> int | None:
    """The sequence length a model was built for (its config's max_seq_len / max_position_embeddings), if known."""
    config = getattr(model, "config", None)
    for key in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


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
