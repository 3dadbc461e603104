"""The chunked cross-entropy (llmfoundry.models.chunked_loss behind causal_lm_loss, #30): bitwise the plain
F.cross_entropy of the upcast logits in value and gradient, at any chunk size, with less peak memory."""

from __future__ import annotations

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import llmfoundry.models.chunked_loss as chunked_loss
from llmfoundry.models.loss import causal_lm_loss, reference_causal_lm_loss


def loss_and_grad(fn, logits: torch.Tensor, labels: torch.Tensor, reduction: str, offset: int):
    logits = logits.detach().requires_grad_()
    loss = fn(logits, labels, reduction, offset)
    loss.backward(torch.tensor(0.37))  # an upstream gradient other than 1 (the trainer scales the sum)
    return loss.detach(), logits.grad


def batch(shape=(4, 33, 1000), dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=generator) * 3).to(dtype)
    labels = torch.randint(0, shape[-1], shape[:2], generator=generator)
    labels[0, :5] = -100  # a prompt
    labels[-1, -3:] = -100  # padding
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("offset", [1, 0])
@pytest.mark.parametrize("rows", [1, 7, 64, None])  # one row per chunk, chunks across samples, one chunk per sample
def test_chunked_loss_and_gradient_are_bitwise_cross_entropys(monkeypatch, dtype, reduction, offset, rows):
    if rows is not None:
        monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", rows * 4 * 1000)
    logits, labels = batch(dtype=dtype)
    loss, grad = loss_and_grad(causal_lm_loss, logits, labels, reduction, offset)
    want_loss, want_grad = loss_and_grad(reference_causal_lm_loss, logits, labels, reduction, offset)
    assert grad.dtype == dtype
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert (grad[:, logits.size(1) - offset:] == 0).all()  # the positions without a target get no gradient


def test_bf16_logits_stay_within_bf16_rounding_of_the_fp32_loss():
    logits, labels = batch()
    loss, grad = loss_and_grad(causal_lm_loss, logits.bfloat16(), labels, "mean", 1)
    want_loss, want_grad = loss_and_grad(reference_causal_lm_loss, logits, labels, "mean", 1)
    torch.testing.assert_close(loss, want_loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad.float(), want_grad, rtol=1.6e-2, atol=1e-5)


def test_chunked_loss_matches_under_autocast_through_a_linear_head(monkeypatch):
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 5 * 4 * 50257)  # an odd vocabulary, several chunks per sample
    head = torch.nn.Linear(32, 50257)
    hidden = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (causal_lm_loss, reference_causal_lm_loss):
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(hidden)
            loss = fn(logits, labels, "sum")
        loss.backward()
        results.append((loss.detach(), head.weight.grad.clone(), head.bias.grad.clone()))
    assert logits.dtype == torch.bfloat16
    for ours, reference in zip(*results):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_every_target_ignored_gives_what_cross_entropy_gives():
    logits, labels = batch()
    labels[:] = -100
    for reduction in ("mean", "sum"):
        loss, grad = loss_and_grad(causal_lm_loss, logits, labels, reduction, 1)
        want_loss, want_grad = loss_and_grad(reference_causal_lm_loss, logits, labels, reduction, 1)
        # sum: 0 and a zero gradient; mean: 0/0, NaN, as F.cross_entropy gives
        torch.testing.assert_close(loss, want_loss, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("bad", [-1, 1000])
def test_a_label_outside_the_vocabulary_is_an_error(bad):
    logits, labels = batch()
    labels[1, 4] = bad
    with pytest.raises((RuntimeError, IndexError), match="out of bounds"):
        causal_lm_loss(logits, labels)


def peak_bytes(fn, logits: torch.Tensor, labels: torch.Tensor) -> int:
    """The most bytes of tensors alive at once (the logits and their gradient included) through forward and
    backward, as torch's MemTracker counts them on the CPU."""
    logits = logits.detach().requires_grad_()
    tracker = MemTracker()
    tracker.track_external(logits)
    with tracker:
        fn(logits, labels, "sum").backward()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [8, None])  # chunks of CHUNK_BYTES; by default this small batch is cut in eight
def test_chunked_loss_peaks_lower_by_at_least_the_fp32_logits(monkeypatch, dtype, rows):
    b, t, v = 4, 64, 4096
    if rows is None:
        rows = b * t // chunked_loss.MIN_CHUNKS
    else:
        monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", rows * 4 * v)
    logits, labels = batch((b, t, v), dtype)
    ours = peak_bytes(causal_lm_loss, logits, labels)
    reference = peak_bytes(reference_causal_lm_loss, logits, labels)
    fp32_logits = b * (t - 1) * v * 4  # F.cross_entropy's log-softmax alone (and, for bf16, the upcast copy)
    assert reference - ours >= fp32_logits, (ours, reference)
    # what is left: the logits, their gradient and three chunk-sized fp32 buffers (plus B*T-sized vectors)
    assert ours <= 2 * logits.nbytes + 3 * rows * v * 4 + 64 * b * t, (ours, reference)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [7, None])
def test_chunked_loss_is_bitwise_cross_entropys_on_cuda_with_less_memory(monkeypatch, dtype, rows):
    if rows is not None:
        monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", rows * 4 * 50368)
    logits, labels = batch((4, 257, 50368), dtype)
    logits, labels = logits.cuda(), labels.cuda()
    results = {}
    for fn in (causal_lm_loss, reference_causal_lm_loss):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss, grad = loss_and_grad(fn, logits, labels, "sum", 1)
        results[fn] = (loss, grad, torch.cuda.max_memory_allocated() - before)
        del loss, grad
    (loss, grad, ours), (want_loss, want_grad, reference) = results.values()
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert reference - ours >= 4 * 256 * 50368 * 4, (ours, reference)
