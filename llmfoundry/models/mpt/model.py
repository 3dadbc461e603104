"""MPT: a decoder-only transformer, read top to bottom.

    tokens -> wte (+ wpe) -> [norm_1 -> attention -> +residual -> norm_2 -> ffn -> +residual] x n_layers
           -> norm_f -> logits (wte^T when tied, else lm_head)

The ffn is a dense MLP/GLU or a mixture of experts (layers/moe.py); with experts, forward also returns
``aux_loss`` in training: moe_loss_weight times the load-balancing loss, already part of ``loss`` when labels
are given (llm-foundry's total), for the trainer to add to its own cross-entropy.

Parameter names follow llm-foundry's MPT (transformer.wte, transformer.blocks.N.attn.Wqkv, ...), so that
llm-foundry checkpoints and transformers' MptForCausalLM map onto this model one to one.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

from llmfoundry.models.layers.attention import Attention, AttentionMask
from llmfoundry.models.layers.ffn import build_ffn
from llmfoundry.models.layers.init import init_module
from llmfoundry.models.layers.moe import active_share, build_moe, init_experts, load_balancing_loss
from llmfoundry.models.layers.moe_keys import is_moe, loss_weight
from llmfoundry.models.layers.norm import build_norm
from llmfoundry.models.layers.positional import RotaryEmbedding, alibi_slopes, token_positions
from llmfoundry.models.loss import causal_lm_loss
from llmfoundry.models.interface import ModelHooks
from llmfoundry.models.mpt.arch import MPTArch
from llmfoundry.models.mpt.block_overrides import layer_attn_overrides
from llmfoundry.models.mpt.config import MPTConfig, resolve_attn_impl
from llmfoundry.models.mpt.expert_parallel import MPTExpertParallel
from llmfoundry.models.mpt.tensor_parallel import MPTTensorParallel


class MPTBlock(nn.Module):
    def __init__(self, arch: MPTArch, layer_idx: int, attn_impl: str):
        super().__init__()
        norm_bias = not arch.no_bias
        self.norm_1 = build_norm(arch.norm_type, arch.d_model, arch.norm_eps, norm_bias)
        self.attn = Attention(arch, layer_idx, attn_impl)
        self.norm_2 = build_norm(arch.norm_type, arch.d_model, arch.norm_eps, norm_bias)
        self.moe = is_moe(arch.ffn_config.ffn_type)
        self.ffn = build_moe(arch) if self.moe else build_ffn(arch)
        self.resid_attn_dropout = nn.Dropout(arch.resid_pdrop)
        self.resid_ffn_dropout = nn.Dropout(arch.resid_pdrop)

    def forward(self, x: torch.Tensor, mask: AttentionMask, rope=None, cache=None):
        """(B, T, d) -> (B, T, d); a mixture-of-experts block also returns its routing statistics, as an output
        (not a side effect) so that activation checkpointing, reentrant or not, neither loses nor repeats them."""
        x = x + self.resid_attn_dropout(self.attn(self.norm_1(x), mask, rope, cache))
        if self.moe:
            y, routing = self.ffn(self.norm_2(x))
            return x + self.resid_ffn_dropout(y), routing
        x = x + self.resid_ffn_dropout(self.ffn(self.norm_2(x)))
        return x


class MPTModel(nn.Module):
    """Embeddings, blocks and the final norm: (B, T) token ids -> (B, T, d_model) hidden states."""

    def __init__(self, arch: MPTArch):
        super().__init__()
        self.arch = arch
        a = arch.attn_config
        attn_impl = resolve_attn_impl(a.attn_impl)
        self.wte = nn.Embedding(arch.vocab_size, arch.d_model)
        if arch.learned_pos_emb:
            self.wpe = nn.Embedding(arch.max_seq_len, arch.d_model)
        self.emb_drop = nn.Dropout(arch.emb_pdrop)
        self.blocks = nn.ModuleList([MPTBlock(arch, i, attn_impl) for i in range(arch.n_layers)])
        overrides = layer_attn_overrides(arch.block_overrides, arch.n_layers)
        self.windows = [o.get("sliding_window_size", a.sliding_window_size) for o in overrides]  # per layer
        self.norm_f = build_norm(arch.norm_type, arch.d_model, arch.norm_eps, not arch.no_bias)
        # rope_hf_config (its scaling) applies to rope_impl: hf only, as in llm-foundry (validation refuses the rest)
        scaling = a.rope_hf_config if a.rope_impl == "hf" else None
        self.rotary = RotaryEmbedding(arch.head_size, a.rope_theta, scaling, arch.max_seq_len) if a.rope else None
        # ALiBi slopes are a pure function of the config: not a parameter and not saved.
        self.slopes = alibi_slopes(arch.n_heads, a.alibi_bias_max, device="cpu") if a.alibi else None

    def _slopes_on(self, device: torch.device) -> torch.Tensor | None:
        """The ALiBi slopes on ``device``, copied there once: a copy from (pageable) host memory in every forward
        would wait for the GPU to finish what is queued."""
        if self.slopes is not None and self.slopes.device != device:
            self.slopes = self.slopes.to(device)
        return self.slopes

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, S) over cached + new tokens; 0 = padding
        sequence_id: torch.Tensor | None = None,  # (B, T) document ids of packed sequences
        position_ids: torch.Tensor | None = None,  # (B, T)
        cache: DynamicCache | None = None,
        routing: list | None = None,  # MoE: each block's RoutingStats are appended here
    ) -> torch.Tensor:
        arch, a = self.arch, self.arch.attn_config
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if not a.attn_uses_sequence_id:
            sequence_id = None  # llm-foundry semantics: packed documents see each other unless asked otherwise
        if sequence_id is not None and past > 0:
            raise ValueError("sequence_id cannot be combined with a KV cache (it is for packed training batches)")
        # without a mask or given positions the last position is past + T - 1: known without reading the device
        positions_known = position_ids is None and attention_mask is None
        if position_ids is None:
            position_ids = token_positions(B, T, past, attention_mask, input_ids.device)

        x = self.wte(input_ids)  # (B, T, d_model)
        if arch.learned_pos_emb:
            last = past + T - 1 if positions_known else int(position_ids.max())
            if last >= arch.max_seq_len:
                raise ValueError(f"position {last} >= max_seq_len={arch.max_seq_len}")
            x = x + self.wpe(position_ids)
        if arch.embedding_fraction < 1.0:
            # Scale the embedding's gradient (not its value) by embedding_fraction, as in GLM-130B.
            x = x * arch.embedding_fraction + x.detach() * (1 - arch.embedding_fraction)
        x = self.emb_drop(x)

        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        q_pos = torch.arange(past, past + T, device=x.device)
        slopes = self._slopes_on(x.device)
        masks = {  # one mask per sliding window in use (block_overrides may give layers different windows)
            window: AttentionMask.build(q_pos, past + T, attention_mask, sequence_id, slopes, window, dtype,
                                        self.blocks[0].attn.flex_mode(x))
            for window in set(self.windows)
        }
        rope = self.rotary(position_ids, dtype) if self.rotary is not None else None
        for block, window in zip(self.blocks, self.windows):
            x = block(x, masks[window], rope, cache)
            if block.moe:
                x, stats = x
                if routing is not None:
                    routing.append(stats)
        return self.norm_f(x)


class MPTPreTrainedModel(PreTrainedModel):
    config_class = MPTConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["MPTBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        init_module(module, self.arch)
        init_experts(module, self.arch)


class MPTForCausalLM(MPTPreTrainedModel, GenerationMixin):
    supports_sequence_id = True

    def __init__(self, config: MPTConfig):
        super().__init__(config)
        self.arch = arch = config.arch()
        # init_device: meta creates parameters without storage; the trainer materialises them shard by shard
        # (to_empty) and then calls init_parameters().
        with torch.device("meta") if arch.init_device in ("meta", "mixed") else contextlib.nullcontext():
            self.transformer = MPTModel(arch)
            self.lm_head = None if arch.tie_word_embeddings else nn.Linear(arch.d_model, arch.vocab_size, bias=False)
        self.logit_scale = 1 / math.sqrt(arch.d_model) if arch.logit_scale == "inv_sqrt_d_model" else arch.logit_scale
        # MoE: tokens routed to each expert of each layer by training forwards since the last reset (the
        # mbmoe_tok_per_expert callback resets and reads it once per batch); None for a dense model
        self.tokens_per_expert: torch.Tensor | None = None
        self.pretrained_weights = None  # set by the builder of a meta model read from a folder (mpt_causal_lm.py)
        self.post_init()

    @classmethod
    def from_arch(cls, arch: MPTArch) -> "MPTForCausalLM":
        """A freshly initialised model of a valid architecture (a recipe's, which its schema validated); the
        MPTConfig made from it serves save_pretrained and generate."""
        return cls(MPTConfig.from_arch(arch))

    # -- what the trainer relies on ---------------------------------------------------------------------------
    def model_hooks(self) -> ModelHooks:
        marked = [m for m in self.modules() if hasattr(m, "_activation_checkpointing")]  # act_ckpt.py marks them
        moe = is_moe(self.arch.ffn_config.ffn_type)
        return ModelHooks(
            init_parameters=self.init_parameters, init_module=self._init_weights,
            pretrained_weights=self.pretrained_weights,
            checkpoint_targets=[m for m in marked if m._activation_checkpointing] if marked else None,
            tie_word_embeddings=self.arch.tie_word_embeddings,
            tensor_parallel=MPTTensorParallel(self.arch),
            expert_parallel=MPTExpertParallel(int(self.arch.ffn_config.moe_world_size or 1)) if moe else None,
            moe_ffn_type=self.arch.ffn_config.ffn_type if moe else None,
            tokens_per_expert=(lambda: self.tokens_per_expert) if moe else None,
            reset_tokens_per_expert=(lambda: setattr(self, "tokens_per_expert", None)) if moe else None)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.blocks)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per (non-positional) active parameter plus attention's 12 * L * d * T. A
        mixture of experts counts top_k of its experts (and the router), as llm-foundry's n_active_params."""
        f = self.arch.ffn_config
        n = sum(p.numel() * active_share(name, f) for name, p in self.named_parameters()
                if not name.startswith("transformer.wpe"))
        return 6.0 * n + 12.0 * self.arch.n_layers * self.arch.n_heads * self.arch.head_size * seq_len

    @torch.no_grad()
    def init_parameters(self) -> None:
        """(Re)initialise every parameter, e.g. after materialising a meta-device model with to_empty()."""
        for module in self.modules():
            init_module(module, self.arch)
            init_experts(module, self.arch)

    # -- transformers plumbing --------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.transformer.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        sequence_id: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: DynamicCache | None = None,
        use_cache: bool | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        cache: DynamicCache | None = None,
        **kwargs,
    ) -> MoeCausalLMOutputWithPast:
        # transformers >= 5.24 passes the KV cache as ``cache`` (``past_key_values`` before; both are accepted)
        past_key_values = cache if cache is not None else past_key_values
        use_cache = self.arch.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        cache = past_key_values if use_cache or past_key_values is not None else None

        routing = [] if is_moe(self.arch.ffn_config.ffn_type) else None
        h = self.transformer(input_ids, attention_mask, sequence_id, position_ids, cache, routing)  # (B, T, d_model)
        aux_loss = self._moe_loss(routing, input_ids.numel()) if routing else None
        if logits_to_keep:  # generation only needs the last position
            h = h[:, -logits_to_keep:]
        weight = self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(h, weight)  # (B, T, vocab)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.arch.final_logit_softcapping is not None:
            cap = self.arch.final_logit_softcapping
            logits = cap * torch.tanh(logits / cap)

        loss = causal_lm_loss(logits, labels) if labels is not None else None
        if loss is not None and aux_loss is not None:
            loss = loss + aux_loss  # llm-foundry's total: the mean cross-entropy plus the weighted LBL
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits,
                                         past_key_values=cache if use_cache else None)

    def _moe_loss(self, routing: list, num_tokens: int) -> torch.Tensor | None:
        """In training: count the tokens per expert, and return moe_loss_weight * the load-balancing loss (None
        when the weight is 0), as MegaBlocks records it only in training."""
        if not self.training:
            return None
        with torch.no_grad():
            counts = torch.stack([c for c, _ in routing])  # (L, E)
            total = self.tokens_per_expert
            self.tokens_per_expert = counts if total is None or total.device != counts.device else total + counts
        f = self.arch.ffn_config
        weight = loss_weight(f)
        if not weight:
            return None
        return weight * load_balancing_loss(routing, num_tokens, f.moe_top_k, f.moe_lbl_in_fp32)


def _register_auto_classes() -> None:
    """Let AutoConfig / AutoModelForCausalLM open our own save_pretrained folders in this process (whoever imports
    the model class can open them; models/hf.py imports it for that)."""
    try:
        AutoConfig.register(MPTConfig.model_type, MPTConfig)
        AutoModelForCausalLM.register(MPTConfig, MPTForCausalLM)
    except ValueError:  # already registered (module reloaded)
        pass


_register_auto_classes()
