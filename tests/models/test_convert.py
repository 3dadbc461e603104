"""Hugging Face interop: export to transformers' own classes, import back, convert and generate CLIs."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaForCausalLM, MptConfig, MptForCausalLM

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.inference.generate_run import generate_ids
from llmfoundry.models.hf_export import export_hf, to_transformers
from llmfoundry.models.hf_import import arch_from_transformers, from_transformers, load_as_mpt
from llmfoundry.models.mpt.arch import AttnConfig, MPTModelSettings
from llmfoundry.registry import models
from tests.models.helpers import padded_tokens, randomize_norms, tiny_model

ALIBI_MHA_GELU = dict(learned_pos_emb=False, n_heads=6, d_model=48, attn_config={"alibi": True, "clip_qkv": 6.0})
ROPE_GQA_SWIGLU = dict(
    learned_pos_emb=False,
    norm_type="rmsnorm",
    tie_word_embeddings=False,
    attn_config={"rope": True, "attn_type": "grouped_query_attention", "kv_n_heads": 2, "rope_theta": 500.0},
    ffn_config={"ffn_type": "mptglu", "ffn_hidden_size": 88, "ffn_act_fn": {"name": "silu"}},
)
# llm-foundry's default MPT: learned positions, biases everywhere, LayerNorm, GELU MLP (untied, to test lm_head)
LEARNED_BIASED = dict(learned_pos_emb=True, no_bias=False, norm_type="layernorm", tie_word_embeddings=False)
CASES = {"mpt": (ALIBI_MHA_GELU, MptForCausalLM), "llama": (ROPE_GQA_SWIGLU, LlamaForCausalLM),
         "gpt2": (LEARNED_BIASED, GPT2LMHeadModel),
         # llm-foundry's biased MPT with a logit_scale: the scale goes into an untied lm_head (tied models too)
         "gpt2_logit_scale": ({**LEARNED_BIASED, "logit_scale": 0.5}, GPT2LMHeadModel),
         "gpt2_tied_inv_sqrt_d_model": ({**LEARNED_BIASED, "tie_word_embeddings": True,
                                         "logit_scale": "inv_sqrt_d_model"}, GPT2LMHeadModel),
         "llama_tied_logit_scale": ({**ROPE_GQA_SWIGLU, "tie_word_embeddings": True, "logit_scale": 0.25},
                                    LlamaForCausalLM)}


def _ours(overrides):
    model = tiny_model(**overrides)
    randomize_norms(model)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_exported_folder_loads_natively_with_identical_logits(case, tmp_path, tokenizer):
    overrides, cls = CASES[case]
    ours = _ours(overrides)
    assert export_hf(ours, tokenizer, tmp_path) == cls.__name__
    assert any(p.suffix == ".safetensors" for p in tmp_path.iterdir())
    assert (tmp_path / "tokenizer.json").is_file()
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert type(theirs) is cls
    x, mask = padded_tokens()
    keep = mask.bool()
    # Positions count from each row's first real token, as transformers' generate() passes them (this matters
    # for learned absolute positions; ALiBi and RoPE are relative).
    extra = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if cls is GPT2LMHeadModel else {}
    diff = (theirs(x, attention_mask=mask, **extra).logits - ours(x, attention_mask=mask).logits)[keep].abs().max()
    assert diff <= 1e-4

    back = from_transformers(theirs)
    torch.testing.assert_close(back(x).logits, ours(x).logits, atol=1e-5, rtol=0)
    # a recipe can start from the exported folder
    settings = MPTModelSettings(pretrained_model_name_or_path=str(tmp_path), vocab_size=512)
    built = models.get("mpt_causal_lm").builder(settings, tokenizer).eval()
    torch.testing.assert_close(built(x).logits, ours(x).logits, atol=1e-5, rtol=0)


def test_a_recipe_cannot_silently_change_a_pretrained_architecture(tmp_path, tokenizer):
    ours = _ours(ROPE_GQA_SWIGLU)
    ours.save_pretrained(tmp_path)
    build = models.get("mpt_causal_lm").builder
    with pytest.raises(ConfigError) as error:
        build(MPTModelSettings(pretrained_model_name_or_path=str(tmp_path), n_layers=6, d_model=256,
                               attn_config=AttnConfig(qk_ln=True)), tokenizer)  # fmt: skip
    message = str(error.value)
    for key in ("model.n_layers: 6 differs from the pretrained folder's 2", "model.d_model: 256",
                "model.attn_config.qk_ln: True"):
        assert key in message, message
    # how attention runs (not what the network is) may change: packed-document masking for finetuning
    packed = build(MPTModelSettings(pretrained_model_name_or_path=str(tmp_path), attn_config=AttnConfig(
        rope=True, attn_uses_sequence_id=True, attn_impl="torch")), tokenizer)
    assert packed.arch.attn_config.attn_uses_sequence_id and packed.arch.attn_config.attn_impl == "torch"


def test_load_as_mpt_applies_run_time_options_to_the_stored_architecture(tmp_path):
    ours = _ours(ALIBI_MHA_GELU)
    ours.save_pretrained(tmp_path)
    loaded = load_as_mpt(tmp_path, overrides={"init_device": "meta", "resid_pdrop": 0.1},
                         attn_overrides={"attn_impl": "torch"}).eval()  # fmt: skip
    assert loaded.arch.init_device == "cpu" and not any(p.is_meta for p in loaded.parameters())
    assert loaded.arch.resid_pdrop == loaded.config.resid_pdrop == 0.1
    assert loaded.transformer.blocks[0].attn.attn_impl == "torch"
    x = torch.randint(2, 512, (2, 16))
    torch.testing.assert_close(loaded(x).logits, ours(x).logits, atol=1e-5, rtol=1e-4)


def test_an_mpt_config_that_transformers_cannot_hold_is_not_imported_as_something_else():
    config = MptConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=64, no_bias=False,
                       attn_config={"qk_ln": True, "alibi": False})  # fmt: skip
    with pytest.raises(ConfigError, match="sets no_bias: False, attn_config.alibi: False, attn_config.qk_ln: True"):
        arch_from_transformers(config)
    assert arch_from_transformers(MptConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=64)).attn_config.alibi


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_generate_cli_matches_transformers_generate_on_export(case, tmp_path, tokenizer, capsys):
    overrides, _ = CASES[case]
    ours = _ours(overrides)
    ours.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    assert cli(["convert", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 0

    prompts = ["The cat runs over", "A small model learns to predict next token"]
    assert cli(["generate", str(tmp_path / "ours"), *sum([["--prompt", p] for p in prompts], []),
                "--max_new_tokens", "12", "--temperature", "0"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    expected = generate_ids(theirs, tokenizer, prompts, max_new_tokens=12)
    ours_ids = generate_ids(ours, tokenizer, prompts, max_new_tokens=12)
    assert ours_ids == expected and all(len(ids) > 0 for ids in expected)
    for prompt, ids in zip(prompts, expected):
        assert prompt + tokenizer.decode(ids, skip_special_tokens=True) in printed


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(learned_pos_emb=True, norm_type="rmsnorm"), "model.norm_type"),
        (dict(learned_pos_emb=True, attn_config={"attn_type": "multiquery_attention"}), "model.attn_config.attn_type"),
        (dict(learned_pos_emb=False, attn_config={"alibi": True, "qk_ln": True}), "model.attn_config.qk_ln"),
        (dict(learned_pos_emb=False, no_bias=False, attn_config={"alibi": True}), "model.no_bias"),
        (dict(learned_pos_emb=False, attn_config={"rope": True}), "model.ffn_config.ffn_type"),
        (dict(learned_pos_emb=False, attn_config={"rope": True, "sliding_window_size": 4},
              ffn_config={"ffn_type": "mptglu"}, norm_type="rmsnorm"), "model.attn_config.sliding_window_size"),
    ],
)
def test_inexpressible_configs_name_the_option(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        to_transformers(tiny_model(**overrides))


def test_convert_dtype_and_bad_paths(tmp_path, tokenizer):
    ours = _ours(ALIBI_MHA_GELU)
    export_hf(ours, tokenizer, tmp_path / "bf16", dtype="bf16")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert next(theirs.parameters()).dtype == torch.bfloat16
    assert cli(["convert", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    with pytest.raises(ConfigError):
        load_as_mpt(tmp_path / "missing")


def test_generate_cli_prompts_file_sampling_seed_and_errors(tmp_path, tokenizer, capsys):
    ours = _ours(ALIBI_MHA_GELU)
    ours.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "prompts.txt").write_text("The dog jumps\nA blue river\nSmall city\n")
    args = ["generate", str(tmp_path / "m"), "--prompts_file", str(tmp_path / "prompts.txt"), "--max_new_tokens", "6",
            "--temperature", "0.9", "--top_p", "0.9", "--top_k", "20", "--seed", "7", "--batch_size", "2"]  # fmt: skip
    assert cli(args) == 0
    first = capsys.readouterr()
    assert first.out.count("### completion") == 3 and "tokens/s" in first.err
    assert cli(args) == 0
    assert capsys.readouterr().out == first.out  # same seed, same samples
    assert cli(["generate", str(tmp_path / "m")]) == 2  # no prompt
    assert "give at least one --prompt" in capsys.readouterr().err
    for bad in (["--max_new_tokens", "0"], ["--top_p", "0"], ["--top_k", "-1"], ["--repetition_penalty", "0"],
                ["--batch_size", "0"]):  # fmt: skip
        assert cli(["generate", str(tmp_path / "m"), "--prompt", "x", *bad]) == 2, bad
        assert capsys.readouterr().err.startswith(f"error: {bad[0]}: ")


def test_a_bias_free_learned_position_model_exports_to_gpt2_with_zero_biases():
    ours = _ours(dict(learned_pos_emb=True, no_bias=True, attn_config={"fused_qkv": False}))
    theirs = to_transformers(ours)
    assert type(theirs) is GPT2LMHeadModel
    assert not theirs.transformer.h[0].attn.c_attn.bias.any()
    x = torch.randint(2, 512, (2, 24))
    torch.testing.assert_close(theirs(x).logits, ours(x).logits, atol=1e-4, rtol=1e-4)
