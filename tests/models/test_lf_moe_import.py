"""llm-foundry's mixture-of-experts MPTs (ffn_type mb_moe, mb_dmoe, torch_dmoe) load into our MPT: as llm-foundry's
HF export (config.json + weights) and as a Composer checkpoint (weights and optimizer state), with the expert
matrices moved from llm-foundry's layouts to ours.

The llm-foundry side is written here by hand from MegaBlocks' and llm-foundry's layouts (the inverse of
layers.moe.expert_weight_from_llm_foundry): mb_dmoe (MegaBlocks' SparseMLP / SparseGLU) and torch_dmoe hold w1, v1,
w2 flat as (experts * ffn_hidden_size, d_model); mb_moe (MegaBlocks' MLP, batched matmuls) holds w1 as (experts,
d_model, ffn_hidden_size) and w2 as (experts, ffn_hidden_size, d_model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.loading import load_model
from llmfoundry.models.hf_import import load_as_mpt
from llmfoundry.models.layers.moe import expert_weight_from_llm_foundry
from llmfoundry.models.mpt.arch import to_dict
from llmfoundry.train.components import training_components
from llmfoundry.train.composer_checkpoint import load_into_training, read_composer_checkpoint
from tests.models.helpers import randomize_norms, tiny_config, tiny_model

MOE = dict(moe_num_experts=4, moe_top_k=2, ffn_hidden_size=48)  # d_model 32 (tests.models.helpers.TINY)
CASES = {
    "mb_dmoe_mlp": dict(ffn_type="mb_dmoe"),
    "mb_dmoe_glu": dict(ffn_type="mb_dmoe", mlp_type="glu", ffn_act_fn={"name": "silu"}),
    "torch_dmoe_mlp": dict(ffn_type="torch_dmoe", moe_top_k=1),
    "torch_dmoe_glu": dict(ffn_type="torch_dmoe", mlp_type="glu", moe_normalize_expert_weights=1),
    "mb_moe_mlp": dict(ffn_type="mb_moe"),
    "mb_moe_square": dict(ffn_type="mb_moe", ffn_hidden_size=32),  # ffn_hidden_size == d_model: only ffn_type tells
}
COMPOSER_TOKENIZER = Path(__file__).parent.parent / "fixtures" / "composer" / "mpt_monolithic" / "ep0-ba2-rank0.pt"
IDS = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(5))


def ours(case: dict, seed: int = 0, **overrides):
    """A tiny MoE MPT of ours whose every weight matters (norms, MegaBlocks' output bias drawn, not 1 / 0)."""
    model = tiny_model(seed, **{"no_bias": False, **overrides}, ffn_config={**MOE, **case})
    randomize_norms(model, seed + 1)
    with torch.no_grad():
        for block in model.transformer.blocks:
            if block.ffn.experts.bias is not None:
                block.ffn.experts.bias.normal_(generator=torch.Generator().manual_seed(seed + 2))
    return model.eval()


def to_llm_foundry(name: str, tensor: torch.Tensor, ffn_type: str) -> torch.Tensor:
    """Our expert matrix (E, h, d) as llm-foundry stores it for ``ffn_type``; anything else as it is."""
    if ".experts.mlp." not in name:
        return tensor.clone()
    if ffn_type == "mb_moe":
        return tensor.clone() if name.endswith(".w2") else tensor.transpose(1, 2).contiguous()
    return tensor.reshape(-1, tensor.shape[-1]).clone()


def lf_config(model, case: dict) -> dict:
    """config.json as llm-foundry's MPTConfig writes it for ``model``: its keys, the user's ffn_config with the
    fc_type llm-foundry copies in (and return_bias: false for MegaBlocks' types), model_type mpt, an auto_map."""
    values = to_dict(model.arch)
    values.pop("init_config")
    megablocks = {"return_bias": False} if case["ffn_type"].startswith("mb_") else {}
    ffn = {**MOE, "fc_type": {"name": "torch"}, "moe_world_size": 1, "lbl_process_group": None, **megablocks, **case}
    return {**values, "ffn_config": ffn, "fc_type": {"name": "torch"}, "model_type": "mpt",
            "architectures": ["MPTForCausalLM"], "torch_dtype": "float32",
            "auto_map": {"AutoConfig": "configuration_mpt.MPTConfig",
                         "AutoModelForCausalLM": "modeling_mpt.MPTForCausalLM"}}  # fmt: skip


def lf_state(model, ffn_type: str) -> dict[str, torch.Tensor]:
    return {name: to_llm_foundry(name, t, ffn_type) for name, t in model.state_dict().items()}


def write_lf_folder(model, case: dict, folder: Path, state: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(lf_config(model, case)))
    save_file(state or lf_state(model, case["ffn_type"]), str(folder / "model.safetensors"))
    return folder


def write_composer(model, case: dict, path: Path, moments: dict[str, dict[str, torch.Tensor]]) -> Path:
    """A monolithic Composer checkpoint (as llm-foundry's trainer saves one) of ``model`` with DecoupledAdamW
    state ``moments`` (our layout; stored in llm-foundry's), its HF config and the Composer fixtures' tokenizer."""
    ffn_type = case["ffn_type"]
    tokenizer = read_composer_checkpoint(COMPOSER_TOKENIZER).tokenizer_files
    optimizer_state = {f"model.{n}": {"step": torch.tensor(2.0), **{k: to_llm_foundry(n, v, ffn_type) for k, v in
                                                                   m.items()}} for n, m in moments.items()}
    state = {
        "model": {f"model.{n}": t for n, t in lf_state(model, ffn_type).items()},
        "optimizers": {"DecoupledAdamW": {"state": optimizer_state, "param_groups": [
            {"lr": 2.5e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "initial_lr": 5e-3,
             "params": [f"model.{n}" for n in moments]}]}},
        "timestamp": {"Timestamp": {"epoch": 0, "batch": 2, "batch_in_epoch": 2, "sample": 16, "token": 1024}},
        "integrations": {"huggingface": {"model": {"config": {"content": lf_config(model, case)}},
                                         "tokenizer": {n: {"content": c} for n, c in tokenizer.items()}}},
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": state, "rng": []}, path)
    return path


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def max_diff(a, b) -> float:
    return (logits(a) - logits(b)).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_an_llm_foundry_moe_export_loads_with_the_same_logits(name, tmp_path):
    model = ours(CASES[name])
    loaded = load_as_mpt(write_lf_folder(model, CASES[name], tmp_path / name))
    assert loaded.arch == model.arch
    assert max_diff(loaded, model) == 0.0
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_mb_moe_experts_are_mlps_whatever_mlp_type_says(tmp_path):
    """MegaBlocks' MoE (mb_moe) always builds MLP experts (w1, w2), so llm-foundry's mb_moe with mlp_type: glu
    saves and computes an MLP; the import follows."""
    model = ours(CASES["mb_moe_mlp"])
    folder = write_lf_folder(model, {**CASES["mb_moe_mlp"], "mlp_type": "glu"}, tmp_path / "mb_moe_glu")
    loaded = load_as_mpt(folder)
    assert loaded.arch.ffn_config.mlp_type == "mlp" and max_diff(loaded, model) == 0.0


@pytest.mark.parametrize("name", ["mb_dmoe_glu", "mb_moe_square", "torch_dmoe_mlp"])
def test_a_wrong_size_expert_matrix_is_a_one_line_error_naming_it(name, tmp_path):
    model = ours(CASES[name])
    state = lf_state(model, CASES[name]["ffn_type"])
    key = "transformer.blocks.1.ffn.experts.mlp.w1"
    state[key] = state[key][:-1].clone()  # one row (mb_moe: one expert) short
    with pytest.raises(ConfigError) as error:
        load_as_mpt(write_lf_folder(model, CASES[name], tmp_path / name, state))
    message = str(error.value)
    assert "\n" not in message and key in message and str(tuple(state[key].shape)) in message, message
    expected = (4, 32, 32) if name == "mb_moe_square" else (4 * model.arch.ffn_hidden, 32)
    assert str(expected) in message, message


def test_the_converter_decides_by_ffn_type_not_by_shape():
    w = torch.randn(4, 32, 32)
    name = "transformer.blocks.0.ffn.experts.mlp.w1"
    assert torch.equal(expert_weight_from_llm_foundry(name, w, "mb_moe", (4, 32, 32)), w.transpose(1, 2))
    assert torch.equal(expert_weight_from_llm_foundry(name.replace("w1", "w2"), w, "mb_moe", (4, 32, 32)), w)
    flat = w.reshape(128, 32)
    assert torch.equal(expert_weight_from_llm_foundry(name, flat, "torch_dmoe", (4, 32, 32)), w)
    router = torch.randn(4, 32)
    assert expert_weight_from_llm_foundry("transformer.blocks.0.ffn.router.layer.weight", router, "mb_moe",
                                          (4, 32, 32)) is router
    assert expert_weight_from_llm_foundry(name, flat, "mptmlp", (4, 32, 32)) is flat  # not an MoE: untouched
    with pytest.raises(ConfigError, match=r"'transformer.blocks.0.ffn.experts.mlp.w1' has shape \(128, 32\)"):
        expert_weight_from_llm_foundry(name, flat, "mb_moe", (4, 32, 32))


@pytest.mark.parametrize("option, message", [
    ({"moe_weight_parallelism": True}, "ffn_config.moe_weight_parallelism: expert weight parallelism"),
    ({"moe_capacity_factor": 1.25}, "ffn_config.moe_capacity_factor: 1.25 cannot be imported"),
    ({"return_bias": True}, "ffn_config.return_bias: True cannot be imported"),
])  # fmt: skip
def test_moe_options_our_mpt_cannot_honour_are_one_line_errors(option, message, tmp_path):
    model = ours(CASES["mb_dmoe_mlp"])
    folder = write_lf_folder(model, {**CASES["mb_dmoe_mlp"], **option}, tmp_path / "moe")
    with pytest.raises(ConfigError) as error:
        load_as_mpt(folder)
    assert "\n" not in str(error.value) and message in str(error.value), str(error.value)


def test_an_expert_parallel_export_loads_on_one_process(tmp_path):
    """moe_world_size says how the experts were split across ranks while training, not what the model computes."""
    model = ours(CASES["mb_dmoe_glu"])
    folder = write_lf_folder(model, {**CASES["mb_dmoe_glu"], "moe_world_size": 2}, tmp_path / "ep")
    loaded = load_as_mpt(folder)
    assert loaded.arch.ffn_config.moe_world_size == 1 and max_diff(loaded, model) == 0.0


# ----- Composer checkpoints -----
@pytest.mark.parametrize("name", ["mb_dmoe_glu", "torch_dmoe_mlp", "mb_moe_mlp", "mb_moe_square"])
def test_a_composer_moe_checkpoint_resumes_weights_and_optimizer_state(name, tmp_path):
    case = CASES[name]
    model = ours(case)
    g = torch.Generator().manual_seed(7)
    moments = {n: {"exp_avg": torch.randn(p.shape, generator=g), "exp_avg_sq": torch.rand(p.shape, generator=g)}
               for n, p in model.named_parameters()}
    path = write_composer(model, case, tmp_path / "save" / "ep0-ba2-rank0.pt", moments)
    fresh = ours(case, seed=3)
    assert max_diff(fresh, model) > 0.0
    optimizer = torch.optim.AdamW(fresh.parameters(), lr=5e-3)
    load_into_training(read_composer_checkpoint(path), weights_and_optimizer(fresh, optimizer),
                       optimizer_name="decoupled_adamw")
    assert max_diff(fresh, model) == 0.0
    assert optimizer.param_groups[0]["lr"] == 2.5e-3
    for n, p in fresh.named_parameters():
        for k, expected in moments[n].items():
            assert torch.equal(optimizer.state[p][k], expected), (n, k)
    # and written out as llm-foundry's HF folder (eval, generate, convert read it so), the same model
    loaded, _ = load_model(path)
    assert max_diff(loaded, model) == 0.0


def weights_and_optimizer(model, optimizer) -> dict:
    """A run's model and optimizer components (train.components), without its RNG: this process's is left alone."""
    components = training_components(model, optimizer)
    return {name: components[name] for name in ("model", "optimizer")}


def test_a_wrong_size_expert_tensor_in_a_composer_checkpoint_is_a_one_line_error(tmp_path):
    case = CASES["mb_moe_mlp"]
    model = ours(case)
    moments = {n: {"exp_avg": torch.zeros(p.shape), "exp_avg_sq": torch.zeros(p.shape)}
               for n, p in model.named_parameters()}
    key = "transformer.blocks.0.ffn.experts.mlp.w2"
    moments[key]["exp_avg"] = torch.zeros(4, 48, 31)  # our layout, one column short: llm-foundry's the same for w2
    path = write_composer(model, case, tmp_path / "ep0-ba2-rank0.pt", moments)
    fresh = ours(case, seed=3)
    with pytest.raises(ConfigError) as error:
        load_into_training(read_composer_checkpoint(path), weights_and_optimizer(fresh, torch.optim.AdamW(
            fresh.parameters())), optimizer_name="decoupled_adamw")
    message = str(error.value)
    assert "\n" not in message and key in message and "(4, 48, 31)" in message and "(4, 48, 32)" in message, message


def test_a_recipe_asking_mb_moe_for_glu_experts_is_refused_as_llm_foundry_would_train_mlps():
    """MegaBlocks' mb_moe always builds MLP experts: a recipe with mlp_type glu would train something else here."""
    with pytest.raises(ConfigError, match=r"model.ffn_config.mlp_type: glu with ffn_type mb_moe.*ffn_type: mb_dmoe "
                                          r"for GLU experts"):
        tiny_config(ffn_config={**MOE, "ffn_type": "mb_moe", "mlp_type": "glu"})
    assert tiny_config(ffn_config={**MOE, "ffn_type": "mb_dmoe", "mlp_type": "glu"}).arch().ffn_config.mlp_type == "glu"


def test_llmfoundry_convert_writes_a_composer_moe_checkpoint_as_transformers_dbrx(tmp_path):
    """DBRX's architecture (GLU experts, RoPE, bias-free LayerNorm): convert writes transformers' own class."""
    case = dict(ffn_type="mb_dmoe", mlp_type="glu", ffn_act_fn={"name": "silu"}, moe_normalize_expert_weights=1)
    model = ours(case, no_bias=True, learned_pos_emb=False, norm_type="low_precision_layernorm",
                 attn_config={"rope": True, "rope_theta": 500.0, "clip_qkv": 0.3})
    path = write_composer(model, case, tmp_path / "ep0-ba2-rank0.pt", {})
    assert cli(["convert", str(path), str(tmp_path / "hf")]) == 0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=False).eval()
    assert type(theirs).__name__ == "DbrxForCausalLM"
    assert max_diff(theirs, model) <= 1e-4
