"""FlexAttention form of the attention mask: a block-sparse ``BlockMask`` plus a ``score_mod`` for ALiBi and
logit soft-capping, so that attention keeps a fused (flash-class) kernel where SDPA would need a dense mask.

Why: SDPA takes padding, packed documents (``sequence_id``), sliding windows and ALiBi only as a dense
(B|1, H|1, T, S) ``attn_mask``, which sends it to its math / memory-efficient kernels on GPUs (and the ALiBi bias
alone is B x H x T x S numbers). ``torch.nn.attention.flex_attention`` generates one fused kernel from a mask
function and a score function instead, and skips the blocks the mask empties.

What it computes is exactly what ``AttentionMask.build``'s dense tensor means (tests/models/test_flex_attention.py
checks it against the reference implementation): key k is visible from query q when k <= q, q - k <= window,
key k is not padding and both are in the same document; a query that may see nothing (a padding position) sees
every key instead, as in the dense mask, so that its (ignored) output and the gradients match too.

On CUDA both ``flex_attention`` and ``create_block_mask`` run through ``torch.compile`` (compiled lazily, once
per process): uncompiled, FlexAttention falls back to a reference that materialises the full score matrix. On a
CPU it runs eagerly (that is for tests and ``attn_impl: flex`` on a laptop, not for speed).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._triton import has_triton

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # torch without FlexAttention: SDPA keeps every case (see available())
    BlockMask = create_block_mask = flex_attention = None

_compiled: dict[str, Callable] = {}


def available() -> bool:
    return flex_attention is not None


def kernel_fits(head_dim: int, device: torch.device) -> bool:
    """The compiled CUDA kernel needs heads of at least 16 numbers (tl.dot's smallest tile; other sizes are
    padded to a power of two by torch itself), Triton, and a GPU it supports well (Ampere or newer)."""
    if device.type == "cpu":
        return True
    if device.type == "cuda" and not cuda_kernels(device):
        return False
    return head_dim >= 16


@functools.cache
def cuda_kernels(device: torch.device) -> bool:
    """Whether FlexAttention's Triton kernels serve this GPU: Triton installed, Ampere (8.0) or newer."""
    return torch.cuda.get_device_capability(device) >= (8, 0) and has_triton()


def trains_on(device: torch.device) -> bool:
    """Whether torch's FlexAttention has a backward on this device: it refuses one on CPU (and MPS)."""
    return device.type not in ("cpu", "mps")


def _compiled_fn(name: str) -> Callable:
    """torch.compile(fn) made on first use: compiling at import would cost every process that never uses it."""
    if name not in _compiled:
        _compiled[name] = torch.compile(flex_attention if name == "flex_attention" else create_block_mask)
    return _compiled[name]


@dataclass
class FlexMask:
    """One forward's mask in FlexAttention's terms, shared by all blocks (like the dense mask it replaces)."""

    block_mask: "BlockMask"
    slopes: torch.Tensor | None  # (H,) fp32 ALiBi slopes on the device, or None


def _mask_mod(window: int, key_padding, sequence_id, lonely):
    """may_attend(b, h, q, k) of AttentionMask.build's dense bool mask (the pieces that are None do not apply)."""

    def may_attend(b, h, q, k):
        ok = k <= q
        if window >= 0:
            ok = ok & (q - k <= window)
        if key_padding is not None:
            ok = ok & key_padding[b, k]
        if sequence_id is not None:
            ok = ok & (sequence_id[b, q] == sequence_id[b, k])
        if lonely is not None:
            ok = ok | lonely[b, q]
        return ok

    return may_attend


def _score_mod(slopes: torch.Tensor | None, softcap: float | None):
    """The reference's order: soft-cap the scaled logit first, then add the ALiBi bias -slope * (q - k)."""

    def score_mod(score, b, h, q, k):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score + (k - q).to(torch.float32) * slopes[h]
        return score

    return score_mod


def rows_without_keys(key_padding: torch.Tensor, sequence_id: torch.Tensor | None, window: int) -> torch.Tensor:
    """(B, T) True where a query may attend to no key at all (causal, window, padding and documents together).

    The dense path finds these rows with an ``any`` over its (B, T, S) mask; this finds them in O(B T log T) memory
    and time from the latest real key at or before each query in its own document: the row is empty when there is
    none, or when it lies outside the window (every earlier real key then does too).
    """
    B, T = key_padding.shape
    idx = torch.arange(T, device=key_padding.device).expand(B, T)
    if sequence_id is None:
        last = torch.where(key_padding, idx, -1).cummax(dim=-1).values
    else:
        # Visit the positions grouped by document (a stable sort keeps each document's positions in order) and
        # take a running max of "position + 1 if real, else 0"; each document is lifted above all earlier ones by
        # rank * (T + 1) so that one cummax over the row never carries a maximum from one document into the next.
        order = torch.sort(sequence_id, dim=-1, stable=True).indices
        doc = sequence_id.gather(-1, order)
        starts = torch.ones_like(doc, dtype=torch.bool)
        starts[:, 1:] = doc[:, 1:] != doc[:, :-1]
        lift = starts.long().cumsum(dim=-1) * (T + 1)
        real = torch.where(key_padding.gather(-1, order), order + 1, 0)
        run = (lift + real).cummax(dim=-1).values - lift - 1  # -1: no real key so far in this document
        last = torch.empty_like(run).scatter_(-1, order, run)
    has_key = last >= 0
    if window >= 0:
        has_key = has_key & (idx - last <= window)
    return ~has_key


def build_flex_mask(
    B: int,
    T: int,
    key_padding: torch.Tensor | None,  # (B, T) bool, True = real token; None when nothing is padding
    sequence_id: torch.Tensor | None,  # (B, T) document ids, or None
    slopes: torch.Tensor | None,  # (H,) ALiBi slopes, or None
    window: int,
    device: torch.device,
) -> FlexMask:
    """The FlexAttention mask for T queries over the same T keys (no KV cache)."""
    lonely = rows_without_keys(key_padding, sequence_id, window) if key_padding is not None else None
    per_row = key_padding is not None or sequence_id is not None
    mask_mod = _mask_mod(window, key_padding, sequence_id, lonely)
    # H=None: the mask is the same for every head (ALiBi lives in the score_mod), which makes it H times smaller.
    compile_it = device.type == "cuda" and not torch.compiler.is_compiling()  # inside torch.compile it is traced
    make = _compiled_fn("create_block_mask") if compile_it else create_block_mask
    block_mask = make(mask_mod, B if per_row else None, None, T, T, device=device)
    if slopes is not None:
        slopes = slopes.to(device=device, dtype=torch.float32)
    return FlexMask(block_mask=block_mask, slopes=slopes)


def flex_attend(q, k, v, mask: FlexMask, scale: float, softcap: float | None) -> torch.Tensor:
    """(B, H, T, D) x (B, KV, T, D) -> (B, H, T, D); grouped-query heads read kv head h // (H / KV) as the
    reference does."""
    score_mod = _score_mod(mask.slopes, softcap) if (mask.slopes is not None or softcap is not None) else None
    kwargs = dict(score_mod=score_mod, block_mask=mask.block_mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if torch.compiler.is_compiling():  # a compiled block (compile_config): Dynamo compiles FlexAttention with it
        return flex_attention(q, k, v, **kwargs)
    if q.is_cuda:
        return _compiled_fn("flex_attention")(q, k, v, **kwargs)
    with warnings.catch_warnings():
        # On a CPU the unfused reference is what we mean to run; its "call torch.compile" advice is for GPUs.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, **kwargs)
