"""A mixture-of-experts MPT <-> transformers' own DbrxForCausalLM: export, import, round trip, convert + generate."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, DbrxConfig, DbrxForCausalLM

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.inference.generate_run import generate_ids
from llmfoundry.models.hf_export import export_hf, to_transformers
from llmfoundry.models.hf_import import from_transformers, load_as_mpt
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.registry import models
from tests.models.helpers import padded_tokens, randomize_norms, tiny_model

# DBRX's architecture at toy size: RoPE, GQA, clip_qkv, bias-free LayerNorm, top-2 of 4 GLU experts
MOE = dict(
    d_model=64, n_heads=4, n_layers=2, learned_pos_emb=False, norm_type="low_precision_layernorm",
    attn_config={"rope": True, "rope_theta": 500.0, "attn_type": "grouped_query_attention", "kv_n_heads": 2,
                 "clip_qkv": 0.3},
    ffn_config={"ffn_type": "mb_dmoe", "mlp_type": "glu", "ffn_hidden_size": 48, "ffn_act_fn": {"name": "silu"},
                "moe_num_experts": 4, "moe_top_k": 2, "moe_normalize_expert_weights": 1},
)  # fmt: skip


def _moe(**overrides) -> dict:
    """MOE with ``overrides``; attn_config / ffn_config overrides are merged into MOE's."""
    return {**MOE, **{k: {**MOE[k], **v} if isinstance(MOE.get(k), dict) else v for k, v in overrides.items()}}


def _ours(**overrides):
    model = tiny_model(**_moe(**overrides))
    randomize_norms(model)
    return model


def _dbrx(seed: int = 3) -> DbrxForCausalLM:
    config = DbrxConfig(
        d_model=64, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=512,
        # DbrxAttention requires attn_config.rope_theta (DBRX's key); the rotary tables read rope_parameters
        attn_config={"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 700.0},
        rope_parameters={"rope_type": "default", "rope_theta": 700.0},
        ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2, "moe_normalize_expert_weights": 2.0},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = DbrxForCausalLM(config).eval()
    with torch.no_grad():  # DBRX's init (std 0.02, unit norms) gives near-constant logits; make them tell apart
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model


def _logits(model, x, mask):
    if isinstance(model, DbrxForCausalLM):  # positions from each row's first real token, as ours and generate() count
        return model(x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    return model(x, attention_mask=mask).logits


def _max_diff(a, b, x, mask) -> float:
    return (_logits(a, x, mask) - _logits(b, x, mask))[mask.bool()].abs().max().item()


def test_moe_mpt_exports_to_native_dbrx_with_the_same_logits(tmp_path, tokenizer):
    ours = _ours()  # tied embeddings: DBRX stores the head as a copy
    assert export_hf(ours, tokenizer, tmp_path) == "DbrxForCausalLM"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "dbrx" and "auto_map" not in config
    assert config["attn_config"]["rope_theta"] == config["rope_parameters"]["rope_theta"] == 500.0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert type(theirs) is DbrxForCausalLM
    x, mask = padded_tokens()
    assert _max_diff(theirs, ours, x, mask) <= 1e-4
    # the check can fail: a model whose routing differs gives other logits
    with torch.no_grad():
        theirs.transformer.blocks[0].ffn.router.layer.weight.mul_(-1)
    assert _max_diff(theirs, ours, x, mask) > 1e-2


def test_a_model_without_clip_qkv_exports_to_a_dbrx_transformers_can_run_and_comes_back_unclipped(tmp_path, tokenizer):
    """transformers' DBRX clamps with clip_qkv as both bounds and fails on None: the export writes the widest float."""
    ours = _ours(attn_config={"clip_qkv": None})
    export_hf(ours, tokenizer, tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    x, mask = padded_tokens()
    assert _max_diff(theirs, ours, x, mask) <= 1e-4
    assert load_as_mpt(tmp_path).arch.attn_config.clip_qkv is None
    for dtype in (torch.bfloat16, torch.float16):  # the bound must fit every dtype the export may run in
        assert torch.isfinite(theirs.to(dtype)(x, attention_mask=mask).logits).all()


def test_native_dbrx_imports_as_moe_mpt_with_the_same_logits(tmp_path, tokenizer):
    theirs = _dbrx()
    theirs.save_pretrained(tmp_path)
    ours = load_as_mpt(tmp_path)
    a, f = ours.arch.attn_config, ours.arch.ffn_config
    assert (f.ffn_type, f.mlp_type, f.moe_num_experts, f.moe_top_k, f.moe_normalize_expert_weights) == (
        "mb_dmoe", "glu", 4, 2, 2.0)
    assert (ours.arch.kv_heads, a.rope_theta, a.clip_qkv, ours.arch.tie_word_embeddings) == (2, 700.0, 0.5, False)
    x, mask = padded_tokens()
    assert _max_diff(theirs, ours, x, mask) <= 1e-4
    # a recipe can start from the DBRX folder (model.name: mpt_causal_lm, pretrained_model_name_or_path)
    settings = MPTModelSettings(pretrained_model_name_or_path=str(tmp_path), vocab_size=512)
    built = models.get("mpt_causal_lm").builder(settings, tokenizer).eval()
    assert _max_diff(theirs, built, x, mask) <= 1e-4


def test_round_trips_keep_every_tensor():
    ours = _ours(tie_word_embeddings=False, attn_config={"fused_qkv": False})
    back = from_transformers(to_transformers(ours))
    assert back.arch.attn_config.fused_qkv  # DBRX's Wqkv comes back fused: the same function
    x, mask = padded_tokens()
    assert _max_diff(back, ours, x, mask) <= 1e-5

    theirs = _dbrx()
    again = to_transformers(from_transformers(theirs)).state_dict()
    expected = theirs.state_dict()
    assert again.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(again[name], tensor), name


def test_convert_then_generate_on_the_dbrx_export_gives_our_greedy_tokens(tmp_path, tokenizer, capsys):
    ours = _ours()
    ours.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    assert cli(["convert", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["DbrxForCausalLM"]
    capsys.readouterr()

    prompts = ["The cat runs over", "A small model learns to predict next token"]
    assert cli(["generate", str(tmp_path / "hf"), *sum([["--prompt", p] for p in prompts], []),
                "--max_new_tokens", "12", "--temperature", "0"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    expected = generate_ids(ours, tokenizer, prompts, max_new_tokens=12)
    assert all(len(ids) > 0 for ids in expected)
    for prompt, ids in zip(prompts, expected):
        assert prompt + tokenizer.decode(ids, skip_special_tokens=True) in printed


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(ffn_config={"mlp_type": "mlp"}), "model.ffn_config.mlp_type"),
        (dict(norm_type="rmsnorm"), "model.norm_type"),
        (dict(no_bias=False), "model.no_bias"),
        (dict(norm_eps=1e-6), "model.norm_eps"),
        (dict(attn_config={"rope": False, "alibi": True}), "model.attn_config.rope"),
    ],
)
def test_a_moe_mpt_dbrx_cannot_express_is_a_one_line_error_naming_the_key(overrides, key, tmp_path, tokenizer, capsys):
    ours = tiny_model(**_moe(**overrides))
    with pytest.raises(ConfigError) as error:
        to_transformers(ours)
    message = str(error.value)
    assert message.startswith(f"{key}: transformers' DbrxForCausalLM") and "\n" not in message, message
    ours.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    assert cli(["convert", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 2
    assert key in capsys.readouterr().err


def test_a_dbrx_config_with_two_rope_bases_is_refused(tmp_path):
    theirs = _dbrx()
    theirs.config.attn_config.rope_theta = 500000.0  # DBRX's own key, which transformers 5 no longer reads
    with pytest.raises(ConfigError, match=r"attn_config\.rope_theta \(500000\.0\) differs from rope_parameters"):
        from_transformers(theirs)


def test_rope_scaling_travels_both_ways():
    ours = _ours(attn_config={"rope_impl": "hf", "rope_hf_config": {"type": "linear", "factor": 4.0}})
    theirs = to_transformers(ours)
    assert theirs.config.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
    x, mask = padded_tokens()
    assert _max_diff(theirs, ours, x, mask) <= 1e-4
    back = from_transformers(theirs)
    assert back.arch.attn_config.rope_hf_config == {"type": "linear", "factor": 4.0}
    assert _max_diff(back, ours, x, mask) <= 1e-5


@pytest.mark.parametrize("ffn_type, act, hf_name", [("mb_dmoe", None, "gelu_pytorch_tanh"),  # MegaBlocks' default
                                                    ("torch_dmoe", None, "gelu"), ("mb_dmoe", {"name": "relu"}, "relu")])
def test_expert_activations_keep_their_meaning(ffn_type, act, hf_name):
    ours = _ours(ffn_config={"ffn_type": ffn_type, "ffn_act_fn": act})
    theirs = to_transformers(ours)
    assert theirs.config.ffn_config.ffn_act_fn == {"name": hf_name}
    x, mask = padded_tokens()
    assert _max_diff(theirs, ours, x, mask) <= 1e-4
    assert _max_diff(from_transformers(theirs), ours, x, mask) <= 1e-5
