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


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for RoPE, in the rotate-half layout that Llama (and flash-attn's non-interleaved mode) use."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        # Not a registered buffer: it is cheap to recompute and must never be loaded from (or saved to) checkpoints.
        self._inv_freq: torch.Tensor | None = None

    def inv_freq(self, device) -> torch.Tensor:
        if self._inv_freq is None or self._inv_freq.device != device:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
            self._inv_freq = 1.0 / (self.theta**exponent)
        return self._inv_freq

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) -> cos, sin (B, 1, T, head_dim), computed in fp32 and cast to ``dtype``."""
        freqs = positions[..., None].float() * self.inv_freq(positions.device)  # (B, T, head_dim/2)
        angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, head_dim)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated by the angles in cos/sin (B, 1, T, D)."""
    return x * cos + rotate_half(x) * sin
