"""FlexAttention (#30): the same attention as the dense-mask reference, outputs and gradients, in every masking case;
and the choice of when it runs."""

import types

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.layers import flex_attention
from llmfoundry.models.layers.attention import AttentionMask
from llmfoundry.models.mpt.arch import MPTArch
from tests.models.helpers import masked_batch, randomize_norms, tiny_model

MASKING = {  # attn_config keys, and what the batch carries
    "causal": ({}, ()),
    "sequence_id": ({"attn_uses_sequence_id": True}, ("sequence_id",)),
    "window": ({"sliding_window_size": 5}, ()),
    "padding": ({}, ("padding",)),
    "packed_padded_window": ({"attn_uses_sequence_id": True, "sliding_window_size": 4}, ("sequence_id", "padding")),
}
POSITIONAL = {"alibi": {"alibi": True}, "rope": {"rope": True}, "learned": {}}
HEADS = {"mha": {}, "gqa": {"attn_type": "grouped_query_attention", "kv_n_heads": 2}}


@pytest.fixture
def cpu_backward(monkeypatch):
    """torch refuses FlexAttention's backward on CPU in its wrapper only; its reference backward runs on any device.
    Let it run, so that gradients are compared here and not only on a GPU."""
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)
    monkeypatch.setattr(flex_attention, "trains_on", lambda device: True)


@pytest.fixture
def flex_calls(monkeypatch):
    calls = []
    real = flex_attention.flex_attend

    def counted(*args, **kwargs):
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(flex_attention, "flex_attend", counted)
    return calls


def _pair(positional, masking, heads, impl="flex", model_kw=None, **attn):
    """The torch reference and attn_impl: flex (or ``impl``), same weights."""
    cfg = {**POSITIONAL[positional], **MASKING[masking][0], **HEADS[heads], **attn}
    models = []
    for impl in ("torch", impl):
        model = tiny_model(attn_config={**cfg, "attn_impl": impl}, learned_pos_emb=positional == "learned",
                           **(model_kw or {}))
        randomize_norms(model)
        models.append(model)
    models[1].load_state_dict(models[0].state_dict())
    return models


def _batch(masking):
    packed = "sequence_id" in MASKING[masking][1]
    return masked_batch([0] * 5 + [1] * 19 if packed else None, "padding" in MASKING[masking][1])


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("masking", list(MASKING))
@pytest.mark.parametrize("positional", list(POSITIONAL))
def test_flex_gives_the_reference_outputs_and_gradients(positional, masking, heads, cpu_backward, flex_calls):
    x, kwargs = _batch(masking)
    ref, flex = _pair(positional, masking, heads)
    ref.train(), flex.train()
    out_ref, out_flex = ref(x, labels=x, **kwargs), flex(x, labels=x, **kwargs)
    assert len(flex_calls) == 2  # both blocks ran FlexAttention
    # every position, padding included: a query that may see nothing sees every key in both (see rows_without_keys)
    torch.testing.assert_close(out_flex.logits, out_ref.logits, atol=1e-5, rtol=0)
    out_ref.loss.backward(), out_flex.loss.backward()
    for (name, p), q in zip(ref.named_parameters(), flex.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("positional", ["alibi", "rope"])
def test_flex_soft_caps_logits_as_the_reference_does(positional, cpu_backward, flex_calls):
    x, kwargs = _batch("packed_padded_window")
    ref, flex = _pair(positional, "packed_padded_window", "gqa", attn_logit_softcapping=0.5)
    out_ref, out_flex = ref(x, labels=x, **kwargs), flex(x, labels=x, **kwargs)
    assert flex_calls
    torch.testing.assert_close(out_flex.logits, out_ref.logits, atol=1e-5, rtol=0)
    out_ref.loss.backward(), out_flex.loss.backward()
    for (name, p), q in zip(ref.named_parameters(), flex.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)
    _, uncapped = _pair(positional, "packed_padded_window", "gqa")
    uncapped.load_state_dict(flex.state_dict())
    assert not torch.allclose(uncapped(x, **kwargs).logits, out_flex.logits, atol=1e-3)


def _dense_rows_without_keys(key_padding, sequence_id, window):
    T = key_padding.shape[1]
    pos = torch.arange(T)
    allowed = (pos[None, :] <= pos[:, None])[None] & key_padding[:, None, :]
    if window >= 0:
        allowed = allowed & (pos[:, None] - pos[None, :] <= window)[None]
    if sequence_id is not None:
        allowed = allowed & (sequence_id[:, :, None] == sequence_id[:, None, :])
    return ~allowed.any(dim=-1)


@pytest.mark.parametrize("window", [-1, 1, 3])
@pytest.mark.parametrize("documents", ["none", "runs", "interleaved"])
def test_rows_without_keys_are_the_dense_masks_empty_rows(window, documents):
    g = torch.Generator().manual_seed(window + 7)
    for _ in range(20):
        key_padding = torch.rand(3, 17, generator=g) < 0.4
        if documents == "none":
            sequence_id = None
        elif documents == "runs":
            sequence_id = torch.randint(0, 2, (3, 17), generator=g).cumsum(dim=-1) - 1  # ids from -1, in runs
        else:  # a document's tokens need not be contiguous for the dense mask; nor here
            sequence_id = torch.randint(-1, 3, (3, 17), generator=g)
        got = flex_attention.rows_without_keys(key_padding, sequence_id, window)
        assert torch.equal(got, _dense_rows_without_keys(key_padding, sequence_id, window))


def test_the_block_mask_skips_blocks_other_documents_own():
    """The point of the block mask: whole blocks of other documents are never computed."""
    T = 512
    sequence_id = torch.arange(T).div(128, rounding_mode="floor")[None]  # four documents of one block each
    q_pos = torch.arange(T)
    packed = AttentionMask.build(q_pos, T, None, sequence_id, None, -1, torch.float32, flex="on")
    causal = AttentionMask.build(q_pos, T, None, None, None, -1, torch.float32, flex="on")
    assert packed.tensor is None and packed.flex is not None  # no dense (B, 1, T, T) mask was made
    assert packed.flex.block_mask.sparsity() > causal.flex.block_mask.sparsity() > 0


@pytest.mark.parametrize("variant", ["mha", "gqa"])
def test_flex_decodes_from_a_kv_cache_like_a_full_forward(variant):
    model = tiny_model(attn_config={"alibi": True, "sliding_window_size": 6, "attn_impl": "flex", **HEADS[variant]},
                       learned_pos_emb=False)
    torch.manual_seed(2)
    x = torch.randint(2, 512, (2, 20))
    full = model(x).logits
    out = model(x[:, :8], use_cache=True)
    pieces, cache = [out.logits], out.past_key_values
    for t in range(8, 20, 3):
        out = model(x[:, t : t + 3], past_key_values=cache, use_cache=True)
        pieces.append(out.logits)
        cache = out.past_key_values
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)


def test_flex_runs_inside_a_compiled_block(monkeypatch):
    """compile_config compiles each block: Dynamo then traces FlexAttention (and the shared BlockMask) into the
    block's graph, in one graph (fullgraph), instead of calling the separately compiled function."""
    traced = []
    real = flex_attention.flex_attend
    monkeypatch.setattr(flex_attention, "flex_attend",
                        lambda *a, **k: traced.append(torch.compiler.is_compiling()) or real(*a, **k))
    x, kwargs = _batch("packed_padded_window")
    ref, flex = _pair("alibi", "packed_padded_window", "gqa")
    for block in flex.transformer.blocks:
        block.compile(backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(flex(x, **kwargs).logits, ref(x, **kwargs).logits, atol=1e-5, rtol=0)
    assert traced == [True, True]


def test_flex_trains_on_a_cpu_through_sdpa(flex_calls):
    """torch has no FlexAttention backward on CPU: training there computes the same attention with SDPA."""
    x, kwargs = _batch("packed_padded_window")
    ref, flex = _pair("alibi", "packed_padded_window", "mha")
    flex.train()
    flex(x, labels=x, **kwargs).loss.backward()
    assert not flex_calls
    with torch.no_grad():
        torch.testing.assert_close(flex(x, **kwargs).logits, ref(x, **kwargs).logits, atol=1e-5, rtol=0)
    assert flex_calls  # without gradients the CPU runs FlexAttention itself


CUDA = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda"))
CPU = types.SimpleNamespace(is_cuda=False, device=torch.device("cpu"))


@pytest.mark.parametrize("impl, attn, device, training, d_model, mode", [
    ("sdpa", {}, CUDA, True, 64, "auto"),  # plain causal stays on SDPA's flash kernel; the rest: FlexAttention
    ("sdpa", {"attn_logit_softcapping": 30.0}, CUDA, True, 64, "on"),  # SDPA cannot soft-cap at all
    ("sdpa", {}, CUDA, False, 64, "off"),  # evaluation and generation keep SDPA (no compile per new shape)
    ("sdpa", {}, CPU, True, 64, "off"),
    ("sdpa", {"attn_pdrop": 0.1}, CUDA, True, 64, "off"),  # FlexAttention has no attention dropout
    ("sdpa", {}, CUDA, True, 32, "off"),  # heads of 8: the CUDA kernel takes 16 or more
    ("torch", {}, CUDA, True, 64, "off"),  # the reference stays the reference
    ("flex", {}, CUDA, True, 64, "on"),
    ("flex", {}, CPU, False, 64, "on"),
    ("flex", {}, CPU, True, 64, "off"),  # no FlexAttention backward on CPU: SDPA trains there
])  # fmt: skip
def test_when_flex_attention_runs(impl, attn, device, training, d_model, mode, monkeypatch):
    monkeypatch.setattr(flex_attention, "cuda_kernels", lambda device: True)  # an Ampere+ GPU with Triton
    model = tiny_model(attn_config={**attn, "attn_impl": impl}, d_model=d_model)
    model.train(training)
    with torch.set_grad_enabled(training):
        assert model.transformer.blocks[0].attn.flex_mode(device) == mode


@pytest.mark.parametrize("impl", ["sdpa", "flex"])
def test_a_gpu_without_flex_attentions_kernels_keeps_sdpa(impl, monkeypatch, caplog):
    """No Triton, or a GPU older than Ampere (V100, T4): the default never compiles FlexAttention there, and an
    explicit attn_impl: flex says in one line that SDPA computes instead."""
    from llmfoundry.core import notices

    monkeypatch.setattr(flex_attention, "cuda_kernels", lambda device: False)
    notices._seen.clear()
    model = tiny_model(attn_config={"attn_impl": impl, "alibi": True}, d_model=64).train()
    with caplog.at_level("WARNING"):
        assert model.transformer.blocks[0].attn.flex_mode(CUDA) == "off"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attn_impl: flex")]
    assert len(said) == (impl == "flex")


def test_flex_with_attention_dropout_is_refused_up_front():
    with pytest.raises(ConfigError, match=r"model\.attn_config\.attn_pdrop: FlexAttention has no attention dropout"):
        validate({"attn_config": {"attn_impl": "flex", "attn_pdrop": 0.1}}, MPTArch, "model")
    validate({"attn_config": {"attn_impl": "flex"}}, MPTArch, "model")  # llm-foundry's attn_impl: flex validates


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl, positional, masking", [
    ("flex", "alibi", "packed_padded_window"),
    ("flex", "rope", "window"),
    ("sdpa", "alibi", "causal"),  # sdpa in training: ALiBi alone goes to FlexAttention
    ("sdpa", "alibi", "sequence_id"),
    ("sdpa", "rope", "padding"),
    ("sdpa", "rope", "causal"),  # plain causal keeps SDPA's own kernel
])  # fmt: skip
def test_compiled_flex_on_cuda_gives_the_reference_outputs_and_gradients(positional, masking, impl, flex_calls):
    """Compiled FlexAttention on CUDA, chosen explicitly or by sdpa in training, in fp32 (TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    x, kwargs = _batch(masking)
    x, kwargs = x.cuda(), {k: v.cuda() for k, v in kwargs.items()}
    # d_model 64: heads of 16, the smallest the CUDA kernel takes (smaller ones keep SDPA)
    ref, fast = (m.cuda().train() for m in _pair(positional, masking, "gqa", impl, {"d_model": 64}))
    out_ref, out_fast = ref(x, labels=x, **kwargs), fast(x, labels=x, **kwargs)
    plain_causal = positional == "rope" and masking == "causal"
    assert bool(flex_calls) == (impl == "flex" or not plain_causal)  # sdpa keeps its causal kernel there
    torch.testing.assert_close(out_fast.logits, out_ref.logits, atol=1e-5, rtol=0)
    out_ref.loss.backward(), out_fast.loss.backward()
    for (name, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)
