"""llm-foundry's own MPT exports (tests/fixtures/lf_mpt_export, made by the real llm-foundry 0.22.0: see its
make_fixtures.py) load as our mpt_causal_lm with llm-foundry's logits, without running the folder's code."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, MptConfig, MptForCausalLM

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import export_hf
from llmfoundry.models.hf_import import is_llm_foundry_mpt_folder, load_as_mpt
from llmfoundry.models.llm_foundry_mpt import is_llm_foundry_mpt
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.registry import models

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lf_mpt_export"
VARIANTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
TOLERANCE = 1e-4  # fp32; the stored logits are rounded to 1e-6


def _expected(folder: Path):
    stored = json.loads((folder / "expected.json").read_text())
    ids, mask = torch.tensor(stored["input_ids"]), torch.tensor(stored["attention_mask"])
    return ids, mask, torch.tensor(stored["logits_at_real_tokens"])


def _max_diff(model, folder: Path) -> float:
    ids, mask, expected = _expected(folder)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    return (logits[mask.bool()].float() - expected).abs().max().item()


def _copy(variant: str, tmp_path: Path) -> Path:
    folder = tmp_path / variant
    shutil.copytree(FIXTURES / variant, folder)
    return folder


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_the_fixtures_cover_the_variants_that_must_import():
    configs = {v: json.loads((FIXTURES / v / "config.json").read_text()) for v in VARIANTS}
    attn = {v: c["attn_config"] for v, c in configs.items()}
    assert any(a["alibi"] for a in attn.values())
    assert {a["rope_impl"] for a in attn.values() if a["rope"]} == {"hf", "dail"}
    assert {a["attn_type"] for a in attn.values()} >= {"grouped_query_attention", "multiquery_attention"}
    assert {c["norm_type"] for c in configs.values()} >= {"rmsnorm", "low_precision_rmsnorm", "layernorm"}
    assert any(c["ffn_config"]["ffn_type"] == "mptglu" for c in configs.values())
    assert any(a["qk_ln"] for a in attn.values()) and any(a["qk_gn"] for a in attn.values())
    assert any(not c["no_bias"] and c["learned_pos_emb"] and c["logit_scale"] for c in configs.values())
    assert all(c["auto_map"] and c["architectures"] == ["MPTForCausalLM"] for c in configs.values())


@pytest.mark.parametrize("attn_impl", ["sdpa", "torch"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_an_llm_foundry_export_loads_with_llm_foundrys_logits(variant, attn_impl):
    model = load_as_mpt(FIXTURES / variant, attn_overrides={"attn_impl": attn_impl})
    assert model.transformer.blocks[0].attn.attn_impl == attn_impl
    assert _max_diff(model, FIXTURES / variant) <= TOLERANCE


def test_the_architecture_is_read_from_llm_foundrys_keys():
    arch = load_as_mpt(FIXTURES / "rope_hf_gqa_glu_rmsnorm_qkln").arch
    a = arch.attn_config
    assert (a.rope, a.rope_impl, a.rope_theta, a.attn_type, a.kv_n_heads, a.qk_ln) == (
        True, "hf", 500.0, "grouped_query_attention", 2, True)  # fmt: skip
    assert a.rope_hf_config["type"] == "llama3" and a.rope_hf_config["original_max_position_embeddings"] == 8
    assert (arch.norm_type, arch.norm_eps, arch.tie_word_embeddings) == ("rmsnorm", 1e-6, False)
    assert (arch.ffn_config.ffn_type, arch.ffn_hidden) == ("mptglu", 24)
    biased = load_as_mpt(FIXTURES / "biased_learned_pos_emb_logit_scale_clip_qkv").arch
    assert (biased.learned_pos_emb, biased.no_bias, biased.logit_scale, biased.attn_config.clip_qkv) == (
        True, False, 0.5, 0.5)  # fmt: skip


def test_a_recipe_starts_from_an_llm_foundry_export(tmp_path):
    folder = _copy("rope_dail_mqa", tmp_path)
    build = models.get("mpt_causal_lm").builder
    model = build(MPTModelSettings(pretrained_model_name_or_path=str(folder), resid_pdrop=0.1), None).eval()
    assert model.arch.resid_pdrop == 0.1 and model.arch.attn_config.rope_impl == "dail"
    assert _max_diff(model, folder) <= TOLERANCE
    with pytest.raises(ConfigError, match="model.n_layers: 6 differs from the pretrained folder's 2"):
        build(MPTModelSettings(pretrained_model_name_or_path=str(folder), n_layers=6), None)


def test_the_folders_python_files_are_never_imported(tmp_path):
    folder = _copy("alibi", tmp_path)
    marker = tmp_path / "imported"
    tripwire = f"open({str(marker)!r}, 'a').write(__name__)\nraise RuntimeError('the model folder code ran')\n"
    for name in ("configuration_mpt.py", "modeling_mpt.py", "__init__.py"):  # auto_map names the first two
        (folder / name).write_text(tripwire)
    modules_before = set(sys.modules)
    load_as_mpt(folder)
    models.get("mpt_causal_lm").builder(MPTModelSettings(pretrained_model_name_or_path=str(folder)), None)
    assert not marker.exists()
    assert not any("modeling_mpt" in m or "configuration_mpt" in m for m in set(sys.modules) - modules_before)


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["attn_config"].update(prefix_lm=True), "attn_config.prefix_lm: True"),
        (lambda c: c["attn_config"].update(attn_temperature_tuning={"floor_scale": 8192, "attn_scale": 0.1}),
         "attn_config.attn_temperature_tuning: {"),
        (lambda c: c["attn_config"].update(nope=True), "attn_config.nope"),
        (lambda c: c["ffn_config"].update(ffn_type="te_ln_mlp"), "ffn_config.ffn_type: 'te_ln_mlp'"),
        (lambda c: c["ffn_config"].update(moe_top_k=2), "ffn_config.moe_top_k: 2"),
        (lambda c: c.update(fc_type={"name": "te"}, ffn_config={"ffn_type": "mptmlp", "fc_type": {"name": "te"}}),
         "fc_type: te"),
        (lambda c: c.update(moe_world_size=8), "moe_world_size: 8"),
        (lambda c: c["attn_config"].update(attn_sink_size=4), "attn_config.attn_sink_size: unknown key"),
        (lambda c: c["attn_config"].update(rope=True, alibi=False, rope_impl="dail",
                                           rope_dail_config={"type": "xpos", "pos_idx_in_fp32": True,
                                                             "xpos_scale_base": 512}),
         "attn_config.rope_dail_config.type: xpos"),
    ],
)  # fmt: skip
def test_an_option_our_mpt_cannot_hold_is_a_one_line_error_naming_it(edit, key, tmp_path):
    folder = _copy("alibi", tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(ConfigError) as error:
        load_as_mpt(folder)
    message = str(error.value)
    assert "\n" not in message and key in message and str(folder / "config.json") in message, message


def test_harmless_llm_foundry_keys_at_their_off_values_are_accepted(tmp_path):
    folder = _copy("alibi", tmp_path)

    def older_export(config):  # keys of older llm-foundry exports (mpt-7b's config.json has these)
        config["attn_config"].update(prefix_lm=False, seq_parallel_world_size=None, kv_n_heads=1)
        config.update(verbose=0, tokenizer_name="EleutherAI/gpt-neox-20b", learned_pos_emb=True)
        config.pop("ffn_config")

    _edit_config(folder, older_export)
    model = load_as_mpt(folder)
    assert not model.arch.learned_pos_emb  # ALiBi replaces learned positions, as in llm-foundry
    assert _max_diff(model, folder) <= TOLERANCE


def test_llm_foundry_configs_are_told_apart_from_transformers_mpt_configs(tmp_path):
    assert all(is_llm_foundry_mpt_folder(FIXTURES / variant) for variant in VARIANTS)
    theirs = MptConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=64)
    assert not is_llm_foundry_mpt({**theirs.to_dict(), "architectures": ["MptForCausalLM"]})
    assert not is_llm_foundry_mpt(theirs.to_diff_dict())
    theirs.save_pretrained(tmp_path)
    assert not is_llm_foundry_mpt_folder(tmp_path) and not is_llm_foundry_mpt_folder(tmp_path / "missing")


def test_weights_that_do_not_fit_or_need_code_are_errors(tmp_path):
    folder = _copy("biased_learned_pos_emb_logit_scale_clip_qkv", tmp_path)  # sharded pytorch_model-*.bin
    index = json.loads((folder / "pytorch_model.bin.index.json").read_text())
    shard = folder / max(index["weight_map"].values())
    state = torch.load(shard, weights_only=True)
    dropped = min(state)
    torch.save({k: v for k, v in state.items() if k != dropped}, shard)
    with pytest.raises(ConfigError, match=f"missing: {dropped.replace('.', '[.]')}"):
        load_as_mpt(folder)
    torch.save({**state, "code": torch.nn.Identity()}, shard)  # unpickling it would need torch.nn's code
    with pytest.raises(ConfigError, match="cannot be read as tensors"):
        load_as_mpt(folder)
    shard.unlink()
    with pytest.raises(ConfigError, match="listed in the folder's weight index but missing"):
        load_as_mpt(folder)


def test_an_imported_model_converts_to_transformers_classes_with_the_same_logits(tmp_path):
    for variant, cls in (("alibi", MptForCausalLM), ("rope_dail_mqa", LlamaForCausalLM)):
        assert export_hf(load_as_mpt(FIXTURES / variant), None, tmp_path / variant) == cls.__name__
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / variant, trust_remote_code=False).eval()
        assert type(theirs) is cls
        assert _max_diff(theirs, FIXTURES / variant) <= TOLERANCE
    # and our own save_pretrained folder of an imported model loads back the same
    load_as_mpt(FIXTURES / "rope_hf_unfused_qkgn").save_pretrained(tmp_path / "ours")
    assert _max_diff(load_as_mpt(tmp_path / "ours"), FIXTURES / "rope_hf_unfused_qkgn") <= TOLERANCE


def test_llmfoundry_convert_writes_an_llm_foundry_export_as_a_transformers_folder(tmp_path, tokenizer):
    folder = _copy("rope_dail_mqa", tmp_path)
    tokenizer.save_pretrained(folder)  # as llm-foundry's hf_checkpointer saves the run's tokenizer beside the model
    assert cli(["convert", str(folder), str(tmp_path / "hf")]) == 0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=False).eval()
    assert type(theirs) is LlamaForCausalLM
    assert _max_diff(theirs, folder) <= TOLERANCE
