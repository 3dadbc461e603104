"""Causal self-attention (MHA / MQA / GQA) and the mask that all blocks of one forward share.

The mask is built once per forward (``AttentionMask.build``) because it depends only on positions, padding and
document ids, not on the layer. It is kept as compact as the case allows:

* plain causal attention over a full sequence -> no tensor at all (SDPA's ``is_causal``);
* padding / packed documents / sliding window / cached decoding -> one boolean (B|1, 1, T, S) tensor;
* ALiBi -> one additive (B|1, H, T, S) tensor in the compute dtype with the mask folded in as -inf;
* or, where FlexAttention runs (see ``Attention.flex_mode``), none of these dense tensors but a ``FlexMask``
  (layers/flex_attention.py): a block-sparse mask plus a score function for ALiBi / soft-capping.

Implementations: ``torch`` (explicit softmax, the reference) and ``sdpa`` (``F.scaled_dot_product_attention``,
which picks fused kernels). ``flash`` uses flash-attn's kernel for the cases it covers (no padding, no packed
documents) and SDPA otherwise. ``flex`` (llm-foundry's name too) runs FlexAttention whenever there is no KV cache,
except where torch cannot: training on a CPU (no backward there) and heads under 16 on CUDA, which use SDPA.
``sdpa`` and ``flash`` switch to FlexAttention by themselves when training on CUDA with a mask SDPA could
only take densely (padding, packed documents, a window, ALiBi) or with soft-capping (which SDPA lacks): the dense
mask would send SDPA to its slow kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmfoundry.core.notices import notice_once
from llmfoundry.models.layers import flex_attention
from llmfoundry.models.layers.norm import build_norm
from llmfoundry.models.layers.positional import alibi_bias, apply_rope

# llm-foundry's attention-class defaults for q_ln / k_ln (see Attention.__init__)
QK_NORM_TYPE = "low_precision_layernorm"
QK_NORM_EPS = 1e-5


@dataclass
class AttentionMask:
    """Which keys each query may attend to, for one forward pass.

    is_causal: nothing else restricts attention and T == S (SDPA can generate the mask itself).
    tensor:    None, a bool (B|1, 1, T, S) "may attend" mask, or a float (B|1, H, T, S) additive bias.
    slopes:    ALiBi slopes (H,) when ALiBi is on (for flash-attn).
    simple:    True when only causality (+ ALiBi / window) matters: no padding, no packed documents.
    flex:      the FlexAttention form (built instead of ``tensor`` when asked for; only without a KV cache).
    """

    is_causal: bool
    tensor: torch.Tensor | None
    slopes: torch.Tensor | None = None
    simple: bool = True
    window: int = -1
    flex: flex_attention.FlexMask | None = None

    @staticmethod
    def build(
        q_pos: torch.Tensor,  # (T,) absolute index of each query in the (cached + new) sequence
        k_len: int,  # S: number of keys, cached + new
        key_padding: torch.Tensor | None,  # (B, S) 1 = real token, 0 = padding
        sequence_id: torch.Tensor | None,  # (B, T) document index of each token (only without a cache)
        slopes: torch.Tensor | None,  # (H,) ALiBi slopes or None
        window: int,  # sliding window size, -1 = unlimited
        dtype: torch.dtype,  # compute dtype of the attention scores
        flex: str = "off",  # Attention.flex_mode: "off", "auto" (unless plain causal) or "on"
    ) -> "AttentionMask":
        device = q_pos.device
        T = q_pos.shape[0]
        has_padding = key_padding is not None and not bool(key_padding.all())
        simple = not has_padding and sequence_id is None
        plain = simple and slopes is None and window < 0
        if flex == "on" or (flex == "auto" and not plain):
            if T == k_len:  # no KV cache: queries and keys are the same positions (decoding keeps the dense mask)
                padding = key_padding.bool() if has_padding else None
                rows = padding if padding is not None else sequence_id
                B = rows.shape[0] if rows is not None else 1
                form = flex_attention.build_flex_mask(B, T, padding, sequence_id, slopes, window, device)
                return AttentionMask(is_causal=False, tensor=None, slopes=slopes, simple=simple, window=window,
                                     flex=form)
        if plain:
            if T == k_len:
                return AttentionMask(is_causal=True, tensor=None)
            if T == 1:  # one new token sees the whole cache
                return AttentionMask(is_causal=False, tensor=None)

        k_pos = torch.arange(k_len, device=device)
        allowed = k_pos[None, :] <= q_pos[:, None]  # (T, S) causal, aligned to the end of the cache
        if window >= 0:
            allowed = allowed & (q_pos[:, None] - k_pos[None, :] <= window)
        allowed = allowed[None, None]  # (1, 1, T, S)
        if has_padding:
            allowed = allowed & key_padding.bool()[:, None, None, :]
        if sequence_id is not None:
            same_doc = sequence_id[:, :, None] == sequence_id[:, None, :]  # (B, T, T)
            allowed = allowed & same_doc[:, None]
        # A query that may see nothing (a padding position) would give NaNs; let it see everything instead.
        # Its output is garbage either way and is ignored by the loss and by generation.
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)

        if slopes is None:
            return AttentionMask(is_causal=False, tensor=allowed, simple=simple, window=window)
        bias = alibi_bias(slopes.to(device), q_pos[None], k_pos[None]).to(dtype)  # (1, H, T, S)
        bias = bias.masked_fill(~allowed, float("-inf"))
        return AttentionMask(is_causal=False, tensor=bias, slopes=slopes, simple=simple, window=window)

    def as_bool(self, T: int, S: int, device) -> torch.Tensor | None:
        """A bool (.., T, S) mask for the explicit implementation (None: attend to everything)."""
        if self.is_causal:
            return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
        if self.tensor is not None and self.tensor.dtype == torch.bool:
            return self.tensor
        return None


def _attend_torch(q, k, v, mask: AttentionMask, scale: float, softcap: float | None, dropout: float, training: bool):
    """The reference: softmax(q k^T * scale [softcapped] + bias) v, in fp32 for the softmax."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:  # grouped-query: query head h reads kv head h // n_rep
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, T, S)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    T, S = scores.shape[-2:]
    if mask.tensor is not None and mask.tensor.dtype != torch.bool:
        scores = scores + mask.tensor
    else:
        allowed = mask.as_bool(T, S, scores.device)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    probs = F.dropout(probs, p=dropout, training=training)
    return torch.matmul(probs, v)


def _attend_sdpa(q, k, v, mask: AttentionMask, scale: float, dropout: float, training: bool):
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v,
        attn_mask=mask.tensor,
        dropout_p=dropout if training else 0.0,
        is_causal=mask.is_causal,
        scale=scale,
        enable_gqa=gqa,
    )  # fmt: skip


def _attend_flash(q, k, v, mask: AttentionMask, scale, softcap, dropout, training):
    from flash_attn import flash_attn_func

    window = (mask.window, 0) if mask.window >= 0 else (-1, -1)
    out = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        dropout_p=dropout if training else 0.0,
        softmax_scale=scale,
        causal=True,
        window_size=window,
        softcap=softcap or 0.0,
        alibi_slopes=mask.slopes.to(device=q.device, dtype=torch.float32) if mask.slopes is not None else None,
    )  # fmt: skip
    return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, arch, layer_idx: int, attn_impl: str):
        super().__init__()
        a = arch.attn_config
        self.layer_idx = layer_idx
        self.attn_impl = attn_impl
        self.n_heads, self.kv_heads, self.head_dim = arch.n_heads, arch.kv_heads, arch.head_size
        q_dim, kv_dim = self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        self.splits = [q_dim, kv_dim, kv_dim]
        self.fused = a.fused_qkv
        bias = arch.qkv_bias
        if self.fused:
            self.Wqkv = nn.Linear(arch.d_model, q_dim + 2 * kv_dim, bias=bias)
            # initialised one head at a time, as llm-foundry does (see layers/init.py)
            self.Wqkv._fused_splits = [self.head_dim] * (self.n_heads + 2 * self.kv_heads)
        else:
            self.q_proj = nn.Linear(arch.d_model, q_dim, bias=bias)
            self.k_proj = nn.Linear(arch.d_model, kv_dim, bias=bias)
            self.v_proj = nn.Linear(arch.d_model, kv_dim, bias=bias)
            for proj, heads in ((self.q_proj, self.n_heads), (self.k_proj, self.kv_heads), (self.v_proj, self.kv_heads)):
                proj._fused_splits = [self.head_dim] * heads
        self.out_proj = nn.Linear(q_dim, arch.d_model, bias=bias)
        self.out_proj._is_residual = True

        # qk_ln normalises the whole q / k projection; qk_gn normalises each head separately. As in llm-foundry,
        # q_ln / k_ln are always low_precision_layernorm with eps 1e-5, whatever the model's norm_type / norm_eps:
        # its MPTBlock passes neither to the attention class, whose defaults these are (so with norm_type: rmsnorm
        # the block norms are RMSNorms but q_ln / k_ln are LayerNorms, which subtract the mean).
        self.qk_ln, self.qk_gn = a.qk_ln, a.qk_gn
        if a.qk_ln or a.qk_gn:
            norm_bias = not arch.no_bias
            self.q_ln = build_norm(QK_NORM_TYPE, self.head_dim if a.qk_gn else q_dim, QK_NORM_EPS, norm_bias)
            self.k_ln = build_norm(QK_NORM_TYPE, self.head_dim if a.qk_gn else kv_dim, QK_NORM_EPS, norm_bias)
        self.clip_qkv = a.clip_qkv
        self.rope_fp32 = a.rope_impl == "dail"  # flash-attn's rotary kernel computes in fp32 (see apply_rope)
        self.scale = a.softmax_scale if a.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.softcap = a.attn_logit_softcapping
        self.dropout = a.attn_pdrop

    def forward(self, x: torch.Tensor, mask: AttentionMask, rope=None, cache=None) -> torch.Tensor:
        B, T, _ = x.shape
        if self.fused:
            qkv = self.Wqkv(x)  # (B, T, q_dim + 2 kv_dim)
            if self.clip_qkv:
                qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
            q, k, v = qkv.split(self.splits, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            if self.clip_qkv:
                q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        # qk_ln / qk_gn come after clip_qkv, and their outputs keep the projections' dtype (as in llm-foundry).
        if self.qk_ln:
            q, k = self.q_ln(q).to(q.dtype), self.k_ln(k).to(k.dtype)

        # heads from the widths: under tensor parallelism (models/mpt/tensor_parallel.py) a rank holds n_heads / tp
        # of them
        q = q.view(B, T, -1, self.head_dim)
        k = k.view(B, T, -1, self.head_dim)
        v = v.view(B, T, -1, self.head_dim)
        if self.qk_gn:
            q, k = self.q_ln(q).to(q.dtype), self.k_ln(k).to(k.dtype)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, head_dim)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin, self.rope_fp32), apply_rope(k, cos, sin, self.rope_fp32)
        if cache is not None:  # append this step's keys/values; attend over everything cached so far
            k, v = cache.update(k, v, self.layer_idx)

        y = self._attend(q, k, v, mask)  # (B, n_heads, T, head_dim)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.out_proj(y)

    def flex_mode(self, x: torch.Tensor) -> str:
        """How ``AttentionMask.build`` should build this forward's mask for FlexAttention (every block shares the
        implementation, dropout and soft-capping of block 0, so the model asks block 0): "on" always (no KV cache),
        "auto" unless the mask is plain causal (SDPA's own causal flash kernel is best there), "off" never."""
        if self.dropout > 0 and self.training:
            return "off"  # FlexAttention has no dropout on the probabilities (attn_impl: flex refuses attn_pdrop)
        if not flex_attention.available() or not flex_attention.kernel_fits(self.head_dim, x.device):
            if self.attn_impl == "flex":
                notice_once(f"attn_impl: flex computes with SDPA on this {x.device.type} (FlexAttention's kernels "
                            "need torch's FlexAttention, heads of 16 or more and, on CUDA, Triton and an Ampere or "
                            "newer GPU)")
            return "off"
        if self.attn_impl == "flex":  # where torch cannot train through it (CPU), SDPA computes the same
            return "on" if flex_attention.trains_on(x.device) or not torch.is_grad_enabled() else "off"
        # Only in training on CUDA: that is where the dense mask costs (a slow kernel, forward and backward), and
        # compiling FlexAttention for every new shape would not pay in generation.
        if self.attn_impl in ("sdpa", "flash") and x.is_cuda and self.training:
            return "on" if self.softcap is not None and self.attn_impl == "sdpa" else "auto"
        return "off"

    def _attend(self, q, k, v, mask: AttentionMask) -> torch.Tensor:
        impl = self.attn_impl
        flash_covers = impl == "flash" and mask.simple and q.dtype in (torch.float16, torch.bfloat16)
        if mask.flex is not None and not flash_covers:
            return flex_attention.flex_attend(q, k, v, mask.flex, self.scale, self.softcap)
        if impl == "flex":
            impl = "sdpa"  # with a KV cache (T != S): the dense mask, as sdpa reads it
        if impl == "flash" and not (mask.simple and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
            impl = "sdpa"  # flash-attn's dense kernel covers neither padding masks nor packed documents
        if impl == "sdpa" and self.softcap is not None:
            impl = "torch"  # SDPA has no logit soft-capping
        if impl == "flash":
            return _attend_flash(q, k, v, mask, self.scale, self.softcap, self.dropout, self.training)
        if impl == "sdpa":
            return _attend_sdpa(q, k, v, mask, self.scale, self.dropout, self.training)
        return _attend_torch(q, k, v, mask, self.scale, self.softcap, self.dropout, self.training)
