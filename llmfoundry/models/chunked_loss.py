"""The log-probability of each position's target, computed over the vocabulary a chunk of rows at a time.

``F.cross_entropy(logits.float(), ...)`` on bf16 logits makes an fp32 copy of every logit (B*T*V*4 bytes) and keeps
an fp32 log-softmax of the same size alive until the backward; with a 50k vocabulary that is the largest activation
of a small model. Here the forward upcasts one chunk of rows, keeps only each row's target log-probability and
saves the logits (which the caller holds anyway); the backward recomputes each chunk's log-softmax and writes the
gradient straight into a tensor of the logits' dtype. Nothing of size B*T*V in fp32 ever exists.

The result is bitwise what ``F.cross_entropy`` gives: each chunk runs the same log-softmax kernel and its backward
on whole rows (those kernels compute every row on its own), and the reduction is torch's own ``nll_loss`` over the
same values in the same order (``target_log_probs`` leaves it to the caller). ``causal_lm_loss`` builds on it.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

# The fp32 size of one chunk (the backward holds three such buffers at once): small next to the logits of a language
# model's batch, large enough that the per-chunk kernel launches stay few (25 chunks for 16 x 2048 tokens over a
# 50k vocabulary). A small batch is still cut into MIN_CHUNKS, or its one chunk would cost what the full copy does.
CHUNK_BYTES = 256 << 20
MIN_CHUNKS = 8


def rows_per_chunk(rows: int, vocab: int) -> int:
    """How many of ``rows`` rows of ``vocab`` logits make one chunk: about CHUNK_BYTES in fp32, and at most an
    eighth (MIN_CHUNKS) of the rows."""
    return max(1, min(CHUNK_BYTES // (4 * max(vocab, 1)), -(-rows // MIN_CHUNKS)))


class _TargetLogProbs(torch.autograd.Function):
    """(N, V) logits of any float dtype and (N,) valid target indices -> (N,) fp32 log p(target)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        picked = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.size(0), chunk):
            rows = slice(start, start + chunk)
            log_probs = torch.log_softmax(logits[rows].float(), dim=-1)
            picked[rows] = log_probs.gather(1, targets[rows, None]).squeeze(1)
            del log_probs  # before the next chunk's is made, not after
        ctx.save_for_backward(logits, targets)
        ctx.chunk = chunk
        return picked

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_picked: torch.Tensor):
        logits, targets = ctx.saved_tensors
        grad = torch.empty_like(logits)
        # the gradient of log p(target) as nll_loss's backward hands it to log_softmax's: one nonzero per row, put in
        # a zeroed buffer and taken out again after each chunk (zeroing a whole chunk each time costs a write of it)
        one_hot = torch.zeros(min(ctx.chunk, logits.size(0)), logits.size(1), device=logits.device)
        for start in range(0, logits.size(0), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            log_probs = torch.log_softmax(logits[rows].float(), dim=-1)  # the forward's values, recomputed
            index = targets[rows, None]
            grad_log_probs = one_hot[:len(index)].scatter_(1, index, grad_picked[rows, None])
            # log_softmax's own backward kernel (not softmax - onehot written out) keeps the result bitwise
            # F.cross_entropy's; the copy into ``grad`` rounds to the logits' dtype as .float()'s backward does
            grad[rows] = torch._log_softmax_backward_data(grad_log_probs, log_probs, -1, torch.float32)
            grad_log_probs.scatter_(1, index, 0.0)
            del log_probs
        return grad, None, None


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                     chunk_rows: int | None = None) -> torch.Tensor:
    """log_softmax(logits.float())[..., target] for logits (..., V) and targets (...), as fp32 of the targets' shape,
    without an fp32 copy of the logits. Positions whose target is ``ignore_index`` get a finite value that carries no
    gradient as long as the caller ignores them (``nll_loss(ignore_index=...)`` gives them zero)."""
    vocab = logits.size(-1)
    flat_logits = logits.reshape(-1, vocab)  # a view for the contiguous logits a model returns
    flat_targets = targets.reshape(-1)
    # ignored positions read column 0 (any valid index): their gradient is zero, so the value never matters
    safe = torch.where(flat_targets == ignore_index, torch.zeros_like(flat_targets), flat_targets)
    chunk = chunk_rows or rows_per_chunk(flat_logits.size(0), vocab)
    return _TargetLogProbs.apply(flat_logits, safe, chunk).view(targets.shape)
