"""Architecture details that must equal llm-foundry's, pinned with small hand-computed forwards."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import to_transformers
from llmfoundry.models.layers.attention import AttentionMask
from llmfoundry.models.layers.norm import LayerNorm, RMSNorm
from llmfoundry.models.layers.positional import apply_rope
from tests.models.helpers import randomize_norms, tiny_config, tiny_model


def test_mptglu_defaults_to_exact_gelu_with_an_unscaled_hidden_width():
    model = tiny_model(ffn_config={"ffn_type": "mptglu"}, expansion_ratio=3)
    ffn = model.transformer.blocks[0].ffn
    assert ffn.up_proj.out_features == ffn.gate_proj.out_features == 3 * 32  # no 2/3 scaling
    # llm-foundry creates gate_proj after up_proj and down_proj
    assert [name for name, _ in ffn.named_children() if name.endswith("proj")] == ["up_proj", "down_proj", "gate_proj"]
    x = torch.randn(2, 5, 32)
    up, gate, down = ffn.up_proj.weight, ffn.gate_proj.weight, ffn.down_proj.weight
    gelu = 0.5 * (x @ gate.T) * (1 + torch.erf((x @ gate.T) / math.sqrt(2)))  # exact, not tanh, not SiLU
    expected = (gelu * (x @ up.T)) @ down.T
    torch.testing.assert_close(ffn(x), expected, atol=1e-5, rtol=1e-4)


def test_mptglu_with_silu_is_swiglu():
    ffn = tiny_model(ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}}).transformer.blocks[0].ffn
    x = torch.randn(3, 32)
    expected = ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x))
    torch.testing.assert_close(ffn(x), expected)


def test_a_fractional_ffn_width_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.expansion_ratio: d_model \* expansion_ratio must be a whole number"):
        tiny_config(expansion_ratio=1.01)
    assert tiny_config(expansion_ratio=1.01, ffn_config={"ffn_hidden_size": 40}).arch().ffn_hidden == 40


def test_qk_ln_normalises_the_clipped_projection_with_a_low_precision_layernorm_whatever_the_norm_type():
    # llm-foundry's MPTBlock passes neither norm_type nor norm_eps to the attention class, so q_ln / k_ln take its
    # defaults: low_precision_layernorm, eps 1e-5 (checked against llm-foundry 0.22.0's model and logits)
    model = tiny_model(norm_type="rmsnorm", norm_eps=0.25, attn_config={"qk_ln": True, "clip_qkv": 0.05,
                                                                      "attn_type": "grouped_query_attention",
                                                                      "kv_n_heads": 2})
    randomize_norms(model)
    assert isinstance(model.transformer.blocks[0].norm_1, RMSNorm)
    attn = model.transformer.blocks[0].attn
    assert isinstance(attn.q_ln, LayerNorm) and attn.q_ln.low_precision and attn.q_ln.eps == 1e-5
    assert attn.q_ln.weight.shape == (32,)
    assert attn.k_ln.weight.shape == (16,)  # kv_n_heads * head_dim: the whole key projection, not one head
    seen = {}
    attn.q_ln.register_forward_hook(lambda mod, inp, out: seen.update(q_in=inp[0], q_out=out))
    x = torch.randn(1, 6, 32)
    attn(x, AttentionMask(is_causal=True, tensor=None))
    q = (x @ attn.Wqkv.weight[:32].T).clamp(-0.05, 0.05)  # clip first, then normalise
    torch.testing.assert_close(seen["q_in"], q)
    centred = q - q.mean(-1, keepdim=True)
    expected = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.q_ln.weight
    if attn.q_ln.bias is not None:
        expected = expected + attn.q_ln.bias
    torch.testing.assert_close(seen["q_out"], expected)


def test_rmsnorm_multiplies_the_weight_in_fp32_and_returns_the_input_dtype():
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(4, 8).to(torch.bfloat16)
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_attention_projections_are_initialised_one_head_at_a_time(fused):
    """llm-foundry splits Wqkv (and unfused Wq/Wk/Wv) at every head: xavier's fan_out is head_dim."""
    d, heads = 64, 2
    model = tiny_model(d_model=d, n_heads=heads, init_config={"name": "xavier_uniform_", "init_gain": 1.0},
                       attn_config={"fused_qkv": fused})
    attn = model.transformer.blocks[0].attn
    w = attn.Wqkv.weight if fused else torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    head_dim = d // heads
    bound_per_head = math.sqrt(6 / (d + head_dim))
    assert w.abs().max().item() <= bound_per_head
    assert w.abs().max().item() > math.sqrt(6 / (d + d))  # would be the bound if q, k, v were each one layer


def test_xavier_with_llm_foundrys_default_gain_of_zero_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.init_config\.init_gain: xavier_normal_ with gain 0"):
        tiny_config(init_config={"name": "xavier_normal_"})


def test_learned_positions_run_on_across_packed_documents():
    """llm-foundry adds wpe(arange(S)) to a packed row; sequence_id only masks attention."""
    model = tiny_model(attn_config={"attn_uses_sequence_id": True})
    seen = {}
    model.transformer.wpe.register_forward_hook(lambda mod, inp, out: seen.update(pos=inp[0]))
    ids = torch.randint(2, 512, (1, 10))
    model(ids, sequence_id=torch.tensor([[0] * 4 + [1] * 6]))
    assert seen["pos"].tolist() == [list(range(10))]
    model(ids, attention_mask=torch.tensor([[0, 0] + [1] * 8]))  # left padding still does not shift positions
    assert seen["pos"].tolist() == [[0, 0] + list(range(8))]


def test_a_default_mptglu_exports_to_llama_with_exact_gelu():
    ours = tiny_model(learned_pos_emb=False, norm_type="rmsnorm", attn_config={"rope": True},
                      ffn_config={"ffn_type": "mptglu"})
    randomize_norms(ours)
    theirs = to_transformers(ours).eval()
    assert isinstance(theirs, LlamaForCausalLM) and theirs.config.hidden_act == "gelu"
    x = torch.randint(2, 512, (2, 12))
    torch.testing.assert_close(theirs(x).logits, ours(x).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rope_impl", ["dail", "hf"])
def test_rope_rotates_halves_and_rounds_like_llm_foundrys_implementation(rope_impl):
    model = tiny_model(learned_pos_emb=False, attn_config={"rope": True, "rope_impl": rope_impl})
    rotary, attn = model.transformer.rotary, model.transformer.blocks[0].attn
    cos, sin = rotary(torch.arange(7)[None], torch.bfloat16)  # (1, 1, T, head_dim), rounded to bf16
    q = torch.randn(1, 4, 7, 8).to(torch.bfloat16)
    half = torch.cat([-q[..., 4:], q[..., :4]], dim=-1)  # rotate-half (non-interleaved) in both implementations
    if rope_impl == "dail":  # flash-attn: fp32 math, one rounding
        expected = (q.float() * cos.float() + half.float() * sin.float()).to(torch.bfloat16)
    else:  # transformers' Llama: bf16 math
        expected = q * cos + half * sin
    got = apply_rope(q, cos, sin, attn.rope_fp32)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    angle = 3 / 10000 ** (2 / 8)  # position 3, frequency index 1
    torch.testing.assert_close(cos[0, 0, 3, 1].float(), torch.tensor(math.cos(angle)), atol=1e-2, rtol=0)
