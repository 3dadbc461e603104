"""llm-foundry's MPT keys for layer implementations, RoPE scaling, activations, inits and per-layer overrides."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import gpt2_export_problems, llama_export_problems, to_transformers
from llmfoundry.models.hf_import import from_transformers
from llmfoundry.models.layers.attention import AttentionMask
from llmfoundry.models.layers.positional import RotaryEmbedding
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import tiny_recipe
from tests.models.helpers import randomize_norms, tiny_config, tiny_model

HEAD_DIM, THETA, MAX_LEN = 16, 10000.0, 64
SCALINGS = {
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16, "beta_slow": 2},
    "yarn_mscale": {"factor": 8.0, "original_max_position_embeddings": 16, "mscale": 0.707, "mscale_all_dim": 1.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("length", [MAX_LEN // 2, 3 * MAX_LEN])  # dynamic only rescales beyond max_seq_len
def test_rope_hf_config_matches_transformers_rotary_embedding(name, length):
    kind = name.split("_")[0]
    params = SCALINGS[name]
    ours = RotaryEmbedding(HEAD_DIM, THETA, {"type": kind, **params}, max_seq_len=MAX_LEN)
    config = LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, max_position_embeddings=MAX_LEN,
                         rope_parameters={"rope_type": kind, "rope_theta": THETA, **params})
    reference = LlamaRotaryEmbedding(config)
    positions = torch.arange(length)[None]
    cos, sin = ours(positions, torch.float32)  # (1, 1, T, D)
    ref_cos, ref_sin = reference(torch.zeros(1, length, HEAD_DIM), positions)  # (1, T, D)
    torch.testing.assert_close(cos[:, 0], ref_cos, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sin[:, 0], ref_sin, rtol=1e-5, atol=1e-6)


def test_linear_rope_scaling_sees_position_p_as_p_over_factor():
    rope = {"rope": True, "rope_impl": "hf", "attn_impl": "torch"}
    plain = tiny_model(attn_config=rope)
    scaled = tiny_model(attn_config={**rope, "rope_hf_config": {"type": "linear", "factor": 2.0}})
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 512, (1, 6))
    positions = torch.arange(6)[None]
    torch.testing.assert_close(scaled(ids, position_ids=2 * positions).logits, plain(ids, position_ids=positions).logits)


@pytest.mark.parametrize("attn_config, message", [
    ({"rope": True, "rope_hf_config": {"type": "linear", "factor": 2.0}}, "applies only with rope: true and rope_impl: hf"),
    ({"rope": True, "rope_impl": "hf", "rope_hf_config": {"type": "yarn"}}, "rope_hf_config.factor: required by type yarn"),
    ({"rope": True, "rope_impl": "hf", "rope_hf_config": {"type": "linear", "factor": 2.0, "beta_fast": 3}},
     "rope_hf_config.beta_fast: not a key of type linear"),
    ({"rope": True, "rope_impl": "hf", "rope_hf_config": {"type": "longrope"}}, "'longrope' is not one of"),
    ({"rope": True, "rope_dail_config": {"type": "xpos", "xpos_scale_base": 512}}, "xpos is not supported"),
    ({"kv_dim": 16}, "kv_dim: keys/values from an input of another width exist only in cross-attention"),
    ({"reuse_kv_layer_idx": -1}, "reuse_kv_layer_idx: reusing another layer's keys and values is not supported"),
    ({"nope": True}, "nope: llm-foundry has no such key; .*learned_pos_emb: false with attn_config.alibi"),
])
def test_attention_keys_that_cannot_be_honoured_are_one_line_errors(attn_config, message):
    with pytest.raises(ConfigError, match=message) as error:
        tiny_config(attn_config=attn_config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides, message", [
    ({"fc_type": "te"}, "fc_type: te .*TransformerEngine.* use fc_type: torch"),
    ({"fc_type": {"name": "torch", "bias": False}}, "fc_type: torch or {name: torch}"),
    ({"ffn_config": {"ffn_type": "mptgeglu"}}, "'mptgeglu' was renamed 'mptglu'"),
    ({"ffn_config": {"ffn_act_fn": {"name": "swish"}}}, "ffn_act_fn.name: 'swish' is not a function of torch.nn.functional"),
    ({"ffn_config": {"ffn_act_fn": {"name": "gelu", "slope": 1}}}, r"ffn_act_fn: torch.nn.functional.gelu\(slope\) is not"),
])
def test_layer_keys_that_cannot_be_honoured_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(**overrides)


def test_fc_type_torch_and_use_pad_tok_in_ffn_are_accepted_and_saved(tmp_path):
    model = tiny_model(fc_type={"name": "torch"}, use_pad_tok_in_ffn=False)
    model.save_pretrained(tmp_path)
    config = MPTConfig.from_pretrained(tmp_path)
    assert config.arch().fc_type == {"name": "torch"} and config.arch().use_pad_tok_in_ffn is False


def test_any_functional_activation_with_its_keywords():
    model = tiny_model(ffn_config={"ffn_act_fn": {"name": "leaky_relu", "negative_slope": 0.2}})
    ffn = model.transformer.blocks[0].ffn
    x = torch.randn(3, 32)
    expected = F.linear(F.leaky_relu(F.linear(x, ffn.up_proj.weight), 0.2), ffn.down_proj.weight)
    torch.testing.assert_close(ffn(x), expected)


def test_triton_rmsnorm_computes_rmsnorm():
    plain = tiny_model(norm_type="rmsnorm")
    randomize_norms(plain)
    triton = tiny_model(norm_type="triton_rmsnorm")
    triton.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 512, (2, 8))
    torch.testing.assert_close(triton(ids).logits, plain(ids).logits)


def test_default_init_is_torchs_own_layer_init_without_residual_scaling():
    model = tiny_model(n_layers=8, no_bias=False, init_config={"name": "default_", "emb_init_std": 0.02})
    out_proj = model.transformer.blocks[0].attn.out_proj
    bound = 1 / math.sqrt(32)  # nn.Linear: kaiming_uniform(a=sqrt(5)) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert out_proj.weight.abs().max() <= bound and out_proj.weight.abs().max() > 0.9 * bound  # not / sqrt(16)
    assert out_proj.bias.abs().max() > 0  # torch's bias init, not zeros
    assert 0.9 < model.transformer.wte.weight.std() < 1.1  # nn.Embedding: N(0, 1); emb_init_std is not read


OVERRIDES = {
    "new": {"start": [{"name": "default", "repeat": 1}], "repeating_pattern": [{"name": "local", "repeat": 1}],
            "overrides": {"local": {"attn_config": {"sliding_window_size": 2}}}},
    "order": {"order": [{"name": "default"}, {"order": [{"name": "local"}], "repeat": 3}],
              "overrides": {"local": {"attn_config": {"sliding_window_size": 2}}}},
}


@pytest.mark.parametrize("shape", list(OVERRIDES))
def test_block_overrides_give_each_layer_its_own_window(shape):
    model = tiny_model(n_layers=4, attn_config={"attn_impl": "torch"}, block_overrides=OVERRIDES[shape])
    assert model.transformer.windows == [-1, 2, 2, 2]
    ids = torch.randint(0, 512, (2, 9))
    # reference: run the blocks by hand, the first with the full causal mask and the others with a window of 2
    t = model.transformer
    x = t.wpe(torch.arange(9))[None] + t.wte(ids)
    q_pos = torch.arange(9)
    for i, block in enumerate(t.blocks):
        x = block(x, AttentionMask.build(q_pos, 9, None, None, None, -1 if i == 0 else 2, x.dtype))
    torch.testing.assert_close(model(ids).logits, F.linear(t.norm_f(x), t.wte.weight))


@pytest.mark.parametrize("spec, message", [
    ({"order": [{"name": "local"}], "overrides": {"local": {}}}, "describes 1 layers, but n_layers is 4"),
    ({"repeating_pattern": [{"name": "a", "repeat": 3}], "overrides": {"a": {}}}, "3 layers do not fill the 4"),
    ({"order": [{"name": "a", "repeat": 4}], "overrides": {}}, "layer name 'a' has no entry"),
    ({"order": [{"name": "a", "repeat": 4}], "overrides": {"a": {"attn_config": {"reuse_kv_layer_idx": -1}}}},
     "reuse_kv_layer_idx: reusing another layer's keys and values is not supported"),
    ({"order": [{"name": "a", "repeat": 4}], "overrides": {"a": {"ffn_config": {"ffn_type": "mptglu"}}}},
     "only attn_config can be overridden"),
    ({"order": [{"name": "a", "repeat": 4}], "overrides": {"a": {"attn_config": {"qk_ln": True}}}},
     "qk_ln: cannot be overridden per layer"),
])
def test_malformed_block_overrides_name_the_key(spec, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(n_layers=4, block_overrides=spec)


LLAMA_LIKE = dict(norm_type="rmsnorm", learned_pos_emb=False, ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}})


def test_export_refuses_what_transformers_cannot_express():
    arch = tiny_config(n_layers=4, block_overrides=OVERRIDES["new"], **LLAMA_LIKE).arch()
    assert any(p.startswith("model.block_overrides:") for p in llama_export_problems(arch))
    scaled = tiny_config(attn_config={"rope": True, "rope_impl": "hf",
                                      "rope_hf_config": {"type": "linear", "factor": 2.0}}, **LLAMA_LIKE).arch()
    assert llama_export_problems(scaled) == []
    assert any(p.startswith("model.attn_config.rope_hf_config:") for p in gpt2_export_problems(scaled))


@pytest.mark.parametrize("name", ["linear", "yarn", "llama3"])
def test_scaled_rope_exports_to_llama_and_back_with_identical_logits(name):
    scaling = {"type": name.split("_")[0], **SCALINGS[name]}
    ours = tiny_model(attn_config={"rope": True, "rope_impl": "hf", "rope_hf_config": scaling}, **LLAMA_LIKE)
    theirs = to_transformers(ours).eval()
    assert theirs.config.rope_parameters["rope_type"] == scaling["type"]
    ids = torch.randint(0, 512, (2, 40))
    torch.testing.assert_close(theirs(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)
    back = from_transformers(theirs)
    assert back.arch.attn_config.rope_hf_config == scaling
    torch.testing.assert_close(back(ids).logits, ours(ids).logits, atol=1e-5, rtol=0)


def test_a_recipe_with_these_keys_validates(mds_root, tokenizer_dir):
    r = tiny_recipe(mds_root, tokenizer_dir)
    r["model"] = {**r["model"], "fc_type": {"name": "torch"}, "use_pad_tok_in_ffn": False, "n_layers": 2,
                  "norm_type": "triton_rmsnorm", "init_config": {"name": "default_"},
                  "block_overrides": {"order": [{"name": "default"}, {"name": "local"}],
                                      "overrides": {"local": {"attn_config": {"sliding_window_size": 8}}}}}
    settings = validate(r, TrainConfig).model.settings
    assert isinstance(settings, MPTModelSettings) and settings.arch().block_overrides["order"][1] == {"name": "local"}


def test_a_model_without_positional_information_warns_as_llm_foundry_does():
    with pytest.warns(UserWarning, match="no positional information"):
        model = tiny_model(learned_pos_emb=False)
    assert not hasattr(model.transformer, "wpe") and model.transformer.rotary is None and model.transformer.slopes is None
