import dataclasses

import pytest
import torch

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.registry import models
from tests.models.helpers import tiny_config, tiny_model


def test_mpt_builder_is_registered_with_its_settings_dataclass(tokenizer):
    entry = models.get("mpt_causal_lm")
    assert entry.config is MPTModelSettings
    assert "name" not in {f.name for f in dataclasses.fields(MPTModelSettings)}
    settings = MPTModelSettings(d_model=32, n_heads=4, n_layers=2, max_seq_len=32, vocab_size=512)
    model = entry.builder(settings, tokenizer)
    assert isinstance(model, MPTForCausalLM)
    assert len(model.blocks()) == 2


def test_a_recipe_built_model_saves_the_config_json_its_values_would_give(tokenizer, tmp_path):
    values = dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=32, vocab_size=512, attn_config={"rope": True},
                  learned_pos_emb=False)
    settings = validate(values, MPTModelSettings, "model")
    built = models.get("mpt_causal_lm").builder(settings, tokenizer)
    assert built.arch == settings.arch() and built.config.n_layers == 3
    built.save_pretrained(tmp_path / "built")
    MPTForCausalLM(MPTConfig(**values)).save_pretrained(tmp_path / "direct")
    assert (tmp_path / "built" / "config.json").read_text() == (tmp_path / "direct" / "config.json").read_text()
    assert MPTForCausalLM.from_pretrained(tmp_path / "built").arch == built.arch


def test_defaults_follow_llm_foundry_except_attn_impl():
    config = MPTConfig()
    assert (config.d_model, config.n_heads, config.n_layers, config.vocab_size) == (2048, 16, 24, 50368)
    assert config.norm_type == "low_precision_layernorm" and config.learned_pos_emb and not config.no_bias
    assert config.attn_config["attn_impl"] == "sdpa"
    assert config.ffn_config["ffn_type"] == "mptmlp" and config.init_config["name"] == "kaiming_normal_"


def test_vocab_smaller_than_tokenizer_is_a_config_error(tokenizer):
    settings = MPTModelSettings(d_model=32, n_heads=4, n_layers=1, max_seq_len=32, vocab_size=100)
    with pytest.raises(ConfigError, match="model.vocab_size"):
        models.get("mpt_causal_lm").builder(settings, tokenizer)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(d_model=30), "model.d_model"),
        (dict(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 3}), "model.attn_config.kv_n_heads"),
        (dict(attn_config={"alibi": True, "rope": True}), "model.attn_config.alibi"),
        (dict(attn_config={"qk_ln": True, "qk_gn": True}), "model.attn_config.qk_ln"),
        (dict(init_config={"name": "baseline_"}), "model.init_config.init_std"),
        (dict(attn_config={"bogus": 1}), "model.attn_config.bogus"),
        (dict(attn_config={"kv_n_heads": 2}), "model.attn_config.kv_n_heads"),  # multihead attention ignores it
        (dict(attn_config={"attn_impl": "triton"}), "model.attn_config.attn_impl"),  # config.json is not typed
        (dict(ffn_config={"ffn_type": "te_ln_mlp"}), "model.ffn_config.ffn_type"),
        (dict(block_overrides={"order": [{"name": "default"}]}), "model.block_overrides"),
    ],
)
def test_invalid_combinations_are_config_errors_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        tiny_config(**overrides)


@pytest.mark.parametrize("scheme", ["alibi", "rope"])
def test_alibi_or_rope_turns_learned_positions_off_as_in_llm_foundry(scheme):
    with pytest.warns(UserWarning, match=f"{scheme} is on, so model.learned_pos_emb is set to false"):
        config = tiny_config(learned_pos_emb=True, attn_config={scheme: True})
    assert config.learned_pos_emb is False
    assert not hasattr(MPTForCausalLM(config).transformer, "wpe")


def test_llm_foundry_keys_that_change_nothing_are_accepted():
    config = tiny_config(fc_type={"name": "torch"}, use_pad_tok_in_ffn=False, verbose=0, block_overrides=None)
    assert config.arch().fc_type == {"name": "torch"} and config.arch().block_overrides is None
    assert not hasattr(config, "verbose")


def test_forward_backward_and_loss_ignores_minus_100():
    model = tiny_model(attn_config={"alibi": True}, learned_pos_emb=False).train()
    x = torch.randint(0, 512, (2, 16))
    labels = x.clone()
    labels[:, :8] = -100
    out = model(x, labels=labels)
    assert out.logits.shape == (2, 16, 512)
    expected = torch.nn.functional.cross_entropy(out.logits[:, 7:-1].reshape(-1, 512), x[:, 8:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tied_embeddings_have_no_separate_head_and_untied_do():
    assert tiny_model().lm_head is None
    untied = tiny_model(tie_word_embeddings=False)
    assert untied.lm_head is not None and untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()


def test_save_and_from_pretrained_round_trip(tmp_path):
    model = tiny_model(attn_config={"rope": True}, learned_pos_emb=False, norm_type="rmsnorm")
    x = torch.randint(0, 512, (1, 12))
    model.save_pretrained(tmp_path)
    loaded = MPTForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.arch == model.arch
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)


def test_meta_init_then_materialise():
    model = MPTForCausalLM(tiny_config(init_device="meta"))
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_parameters()
    out = model(torch.randint(0, 512, (1, 8)))
    assert torch.isfinite(out.logits).all()


def test_flops_per_token_counts_params_and_attention():
    model = tiny_model(learned_pos_emb=False)
    n = sum(p.numel() for p in model.parameters())
    assert model.flops_per_token(16) == pytest.approx(6 * n + 12 * 2 * 32 * 16)


@pytest.mark.parametrize("name", ["kaiming_normal_", "kaiming_uniform_", "xavier_normal_", "xavier_uniform_",
                                  "small_init_", "neox_init_"])
def test_every_init_scheme_gives_finite_nonzero_weights(name):
    gain = {"init_gain": 1.0} if name.startswith("xavier_") else {}  # llm-foundry's gain 0 zeroes xavier weights
    model = tiny_model(init_config={"name": name, "emb_init_std": 0.02, **gain})
    w = model.transformer.blocks[0].attn.Wqkv.weight
    assert torch.isfinite(w).all() and w.std() > 0
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_residual_projections_are_scaled_down():
    torch.manual_seed(0)
    plain = tiny_model(init_config={"init_div_is_residual": False}, n_layers=8)
    scaled = tiny_model(init_config={"init_div_is_residual": True}, n_layers=8)
    ratio = (plain.transformer.blocks[0].ffn.down_proj.weight.std() / scaled.transformer.blocks[0].ffn.down_proj.weight.std()).item()
    assert ratio == pytest.approx(4.0, rel=0.15)  # sqrt(2 * 8)


def test_a_config_json_gets_the_recipe_schemas_answers_word_for_word(tmp_path):
    """One validator for both forms: the same wrong values in a recipe's model section and in a config.json
    give the same messages (a wrong type, a value outside the choices, keys that do not fit together), all at
    once. (Keys that are not MPT's are transformers' in a config.json, kept as it keeps them.)"""
    import json

    from llmfoundry.train.recipe import validate_train_config

    wrong = dict(d_model="wide", norm_type="batchnorm", n_heads=3, attn_config={"alibi": True, "rope": True})
    with pytest.raises(ConfigError) as from_config:
        MPTConfig(**wrong)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": MPTConfig.model_type, **wrong}))
    with pytest.raises(ConfigError) as from_folder:
        MPTForCausalLM.from_pretrained(tmp_path)
    recipe = {"model": {"name": "mpt_causal_lm", **wrong}, "tokenizer": {"name": "gpt2"}, "max_seq_len": 32,
              "global_train_batch_size": 2, "max_duration": "1ba", "optimizer": {"name": "adamw", "lr": 1e-3},
              "train_loader": {"name": "text", "dataset": {"local": str(tmp_path)}}}
    with pytest.raises(ConfigError) as from_recipe:
        validate_train_config(recipe)
    in_recipe = {p for p in from_recipe.value.problems if p.startswith("model.")}
    assert set(from_config.value.problems) == set(from_folder.value.problems) == in_recipe
    assert "model.d_model: expected an int, got 'wide'" in in_recipe
    assert any(p.startswith("model.norm_type: 'batchnorm' is not one of") for p in in_recipe)

    with pytest.raises(ConfigError) as fitting:  # each key valid alone: then how they fit together, as in a recipe
        MPTConfig(d_model=32, n_heads=3, attn_config={"alibi": True, "rope": True})
    assert fitting.value.problems == [
        "model.d_model: 32 is not divisible by model.n_heads=3 (or set model.head_dim)",
        "model.attn_config.alibi and model.attn_config.rope: choose one positional scheme"]
