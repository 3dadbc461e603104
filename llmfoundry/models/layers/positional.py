"""Position information: ALiBi biases, rotary embeddings (RoPE) and the position ids both rely on."""

from __future__ import annotations

import math

import torch


def alibi_slopes(n_heads: int, alibi_bias_max: int = 8, device=None) -> torch.Tensor:
    """(n_heads,) slopes 2^(-alibi_bias_max * h / n), h = 1..n (for n a power of two).

    For other head counts, take the slopes of the next power of two and interleave odd/even ones, as the ALiBi
    paper and MPT do, so that exported models match transformers' MPT exactly.
    """
    n_pow2 = 2 ** math.ceil(math.log2(n_heads))
    exponents = torch.arange(1, n_pow2 + 1, dtype=torch.float32, device=device) * (alibi_bias_max / n_pow2)
    slopes = 1.0 / torch.pow(2.0, exponents)
    if n_pow2 != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(B|1, H, T, S) bias -slope * distance, from query positions (B|1, T) and key positions (B|1, S).

    Using the true distance (not the translation-invariant `slope * k_pos` shortcut) keeps the values near the
    diagonal small, so the bias survives a cast to bf16.
    """
    distance = (k_pos[:, None, :] - q_pos[:, :, None]).to(slopes.dtype)  # (B, T, S), <= 0 where causal
    return distance[:, None, :, :] * slopes[None, :, None, None]


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) segment ids -> (B, T) positions counted from the first token of each segment, a segment being a run
    of equal ids (one packed document, or a run of padding), so that each sees the positions it would see alone."""
    B, T = segment_ids.shape
    idx = torch.arange(T, device=segment_ids.device).expand(B, T)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    segment_start = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - segment_start


def rope_frequencies(head_dim: int, theta: float, scaling: dict, max_seq_len: int, seq_len: int, device=None):
    """(inv_freq (head_dim/2,), attention_factor): RoPE's frequencies under a rope_hf_config scaling.

    linear divides every frequency by factor; dynamic (NTK) raises the base once a sequence is longer than
    max_seq_len; yarn blends interpolated and original frequencies by wavelength and scales cos/sin; llama3
    divides the low frequencies by factor and interpolates the middle band.
    """
    kind = scaling.get("type", "no_scaling")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    if kind == "dynamic" and seq_len > max_seq_len:
        factor = scaling["factor"]
        theta = theta * (factor * seq_len / max_seq_len - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / (theta**exponent)
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling, max_seq_len)
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        context = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelen - low) / (high - low)  # 0 at the low-frequency edge, 1 at the high one
        middle = (wavelen >= context / high) & (wavelen <= context / low)
        return torch.where(middle, (1 - smooth) * scaled / factor + smooth * scaled, scaled), 1.0
    return inv_freq, 1.0


def _yarn(inv_freq: torch.Tensor, dim: int, theta: float, scaling: dict, max_seq_len: int):
    factor = scaling["factor"]
    context = scaling.get("original_max_position_embeddings") or max_seq_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over the context
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.get("beta_fast") or 32), dim_of(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original (extrapolated) frequency, 0: the interpolated one
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for RoPE, in the rotate-half layout that Llama (and flash-attn's non-interleaved mode) use."""

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling: dict | None = None, max_seq_len: int = 2048):
        super().__init__()
        self.head_dim, self.theta, self.max_seq_len = head_dim, theta, max_seq_len
        self.scaling = dict(scaling or {"type": "no_scaling"})
        # Not a registered buffer: it is cheap to recompute and must never be loaded from (or saved to) checkpoints.
        self._inv_freq: tuple[torch.Tensor, float] | None = None

    def frequencies(self, device, seq_len: int) -> tuple[torch.Tensor, float]:
        if self.scaling.get("type") == "dynamic" and seq_len > self.max_seq_len:
            return rope_frequencies(self.head_dim, self.theta, self.scaling, self.max_seq_len, seq_len, device)
        if self._inv_freq is None or self._inv_freq[0].device != device:
            self._inv_freq = rope_frequencies(self.head_dim, self.theta, self.scaling, self.max_seq_len, 0, device)
        return self._inv_freq

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) -> cos, sin (B, 1, T, head_dim), computed in fp32 and cast to ``dtype``.

        dynamic scaling reads the longest sequence of this call (its largest position + 1)."""
        seq_len = int(positions.max()) + 1 if self.scaling.get("type") == "dynamic" else 0
        inv_freq, attention_factor = self.frequencies(positions.device, seq_len)
        freqs = positions[..., None].float() * inv_freq  # (B, T, head_dim/2)
        angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, head_dim)
        return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32_math: bool = False) -> torch.Tensor:
    """x (B, H, T, D) rotated by the angles in cos/sin (B, 1, T, D).

    fp32_math=False computes in x's dtype, as transformers' Llama (llm-foundry's rope_impl: hf) does;
    fp32_math=True computes in fp32 and rounds once, as flash-attn's rotary kernel (rope_impl: dail) does."""
    if not fp32_math or x.dtype == torch.float32:
        return x * cos + rotate_half(x) * sin
    xf = x.float()
    return (xf * cos.float() + rotate_half(xf) * sin.float()).to(x.dtype)


def token_positions(B: int, T: int, past: int, attention_mask, device) -> torch.Tensor:
    """(B, T) position of each new token, as llm-foundry computes it: its index in the row, less the padding
    before it (so left padding does not shift positions). Packed documents (sequence_id) are *not* restarted at
    0: llm-foundry's learned position embeddings see a packed document at its offset in the row (RoPE and ALiBi
    depend only on distances, so for them this makes no difference)."""
    if attention_mask is not None and not bool(attention_mask.all()):
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, S)
        return positions[:, -T:]
    return torch.arange(past, past + T, device=device).expand(B, T)
