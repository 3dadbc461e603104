"""Attention behaviour: implementations agree, masks isolate what they should, the KV cache changes nothing."""

import pytest
import torch

from llmfoundry.models.mpt.config import resolve_attn_impl
from tests.models.helpers import masked_batch, randomize_norms, tiny_model

POSITIONAL = {
    "learned": dict(learned_pos_emb=True),
    "alibi": dict(learned_pos_emb=False, attn_config={"alibi": True}),
    "rope": dict(learned_pos_emb=False, attn_config={"rope": True}),
    "none": dict(learned_pos_emb=False),
}
MASKING = {
    "causal": {},
    "sequence_id": {"attn_uses_sequence_id": True},
    "sliding_window": {"sliding_window_size": 5},
    "padding": {},
}
VARIANTS = {
    "mha": {},
    "gqa": {"attn_type": "grouped_query_attention", "kv_n_heads": 2},
    "mqa_qkln_clip": {"attn_type": "multiquery_attention", "qk_ln": True, "clip_qkv": 3.0},
    "qkgn_unfused": {"qk_gn": True, "fused_qkv": False, "softmax_scale": 0.2},
}


def _model(impl, positional, masking, variant="mha", **extra):
    cfg = dict(POSITIONAL[positional])
    attn = dict(cfg.pop("attn_config", {}))
    attn.update(MASKING[masking])
    attn.update(VARIANTS[variant])
    attn["attn_impl"] = impl
    model = tiny_model(attn_config=attn, **cfg, **extra)
    randomize_norms(model)
    return model


def _batch(masking):
    return masked_batch([0] * 24 if masking == "sequence_id" else None, masking == "padding")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("masking", list(MASKING))
@pytest.mark.parametrize("positional", list(POSITIONAL))
def test_sdpa_matches_torch_reference(positional, masking, variant):
    x, kwargs = _batch(masking)
    ref = _model("torch", positional, masking, variant)
    fast = _model("sdpa", positional, masking, variant)
    fast.load_state_dict(ref.state_dict())
    a, b = ref(x, **kwargs).logits, fast(x, **kwargs).logits
    if masking == "padding":  # outputs at padded positions are meaningless
        keep = kwargs["attention_mask"].bool()
        a, b = a[keep], b[keep]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    # gradients agree too
    fast.train(), ref.train()
    fast(x, labels=x, **kwargs).loss.backward()
    ref(x, labels=x, **kwargs).loss.backward()
    for (name, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("impl", ["torch", "sdpa"])
@pytest.mark.parametrize("positional", list(POSITIONAL))
def test_sequence_id_keeps_packed_documents_apart(impl, positional):
    model = _model(impl, positional, "sequence_id")
    torch.manual_seed(0)
    docs = [torch.randint(2, 512, (1, n)) for n in (9, 7, 8)]
    packed = torch.cat(docs, dim=1)
    seq_id = torch.cat([torch.full((1, d.shape[1]), i) for i, d in enumerate(docs)], dim=1)
    logits = model(packed, sequence_id=seq_id).logits
    start = 0
    for doc in docs:
        # llm-foundry's positions are not restarted per document: a packed document sits at its offset in the row
        at_offset = torch.arange(start, start + doc.shape[1])[None]
        alone = model(doc, position_ids=at_offset).logits
        torch.testing.assert_close(logits[:, start : start + doc.shape[1]], alone, atol=1e-5, rtol=1e-4)
        start += doc.shape[1]
    # Without attn_uses_sequence_id the documents do see each other (llm-foundry semantics).
    leaky = _model(impl, positional, "causal")
    leaky.load_state_dict(model.state_dict())
    assert not torch.allclose(leaky(packed, sequence_id=seq_id).logits[:, 9:16], model(docs[1]).logits, atol=1e-3)


@pytest.mark.parametrize("impl", ["torch", "sdpa"])
@pytest.mark.parametrize("positional", list(POSITIONAL))
def test_packed_documents_in_a_padded_row_see_only_themselves(impl, positional):
    """Finetuning batches pack several examples per row and right-pad it (sequence_id -1 and mask 0 there).
    Positions run on across documents, as in llm-foundry (only learned positions can tell)."""
    model = _model(impl, positional, "sequence_id")
    torch.manual_seed(2)
    docs = [torch.randint(2, 512, (1, n)) for n in (6, 9)]
    packed = torch.cat([*docs, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    seq_id = torch.tensor([[0] * 6 + [1] * 9 + [-1] * 5])
    mask = (seq_id >= 0).long()
    logits = model(packed, attention_mask=mask, sequence_id=seq_id).logits
    torch.testing.assert_close(logits[:, :6], model(docs[0]).logits, atol=1e-5, rtol=1e-4)
    second = model(docs[1], position_ids=torch.arange(6, 15)[None]).logits
    torch.testing.assert_close(logits[:, 6:15], second, atol=1e-5, rtol=1e-4)
    if positional == "learned":  # restarting the positions would be a different model
        assert not torch.allclose(logits[:, 6:15], model(docs[1]).logits, atol=1e-3)


@pytest.mark.parametrize("impl", ["torch", "sdpa"])
@pytest.mark.parametrize("positional", list(POSITIONAL))
def test_left_padding_gives_the_unpadded_logits(impl, positional):
    model = _model(impl, positional, "causal")
    torch.manual_seed(1)
    x = torch.randint(2, 512, (1, 10))
    padded = torch.cat([torch.ones(1, 6, dtype=torch.long), x], dim=1)
    mask = torch.cat([torch.zeros(1, 6, dtype=torch.long), torch.ones_like(x)], dim=1)
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 6:], model(x).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["torch", "sdpa"])
@pytest.mark.parametrize("positional", list(POSITIONAL))
@pytest.mark.parametrize("variant", ["mha", "gqa"])
def test_kv_cache_logits_equal_full_forward(impl, positional, variant):
    model = _model(impl, positional, "sliding_window" if positional == "alibi" else "causal", variant)
    torch.manual_seed(2)
    x = torch.randint(2, 512, (2, 20))
    full = model(x).logits
    out = model(x[:, :8], use_cache=True)
    pieces, cache = [out.logits], out.past_key_values
    for t in range(8, 20, 3):  # feed the rest a few tokens at a time
        out = model(x[:, t : t + 3], past_key_values=cache, use_cache=True)
        pieces.append(out.logits)
        cache = out.past_key_values
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("positional", ["alibi", "rope", "learned"])
def test_cached_generation_equals_uncached_with_padding(positional):
    model = _model("sdpa", positional, "causal")
    torch.manual_seed(4)
    x = torch.randint(2, 512, (2, 9))
    mask = torch.ones_like(x)
    x[0, :3], mask[0, :3] = 1, 0  # left-padded prompt
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=1)
    cached = model.generate(x, use_cache=True, **kwargs)
    uncached = model.generate(x, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    # the padded row generates what it would generate alone
    alone = model.generate(x[:1, 3:], max_new_tokens=8, do_sample=False, pad_token_id=1)
    assert torch.equal(cached[0, 3:], alone[0])


def test_softcapping_and_logit_scale_apply():
    model = tiny_model(final_logit_softcapping=2.0, attn_config={"attn_logit_softcapping": 5.0})
    logits = model(torch.randint(0, 512, (1, 8))).logits
    assert logits.abs().max() <= 2.0
    scaled = tiny_model(logit_scale="inv_sqrt_d_model")
    plain = tiny_model()
    x = torch.randint(0, 512, (1, 8))
    torch.testing.assert_close(scaled(x).logits * 32**0.5, plain(x).logits)


def test_flash_without_flash_attn_falls_back_to_sdpa_with_a_warning():
    try:
        import flash_attn  # noqa: F401

        pytest.skip("flash-attn is installed")
    except ImportError:
        pass
    resolve_attn_impl._warned = False
    with pytest.warns(UserWarning, match="flash-attn is not installed"):
        model = tiny_model(attn_config={"attn_impl": "flash"})
    assert model.transformer.blocks[0].attn.attn_impl == "sdpa"
