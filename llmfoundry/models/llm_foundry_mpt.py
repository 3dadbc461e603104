"""MPT folders exported by llm-foundry itself (its hf_checkpointer, convert_composer_to_hf), read without its code.

Such a folder says ``model_type: mpt``, as transformers' own MptForCausalLM exports do, but its config.json is
llm-foundry's MPTConfig (``ffn_config``, ``norm_eps``, ``fc_type``, ``init_config``, ``architectures:
[MPTForCausalLM]``, an ``auto_map`` to Python files saved beside it) and may describe RoPE, GQA, GLU, RMSNorm,
biases, ... that transformers' MptForCausalLM cannot run. Our MPT uses llm-foundry's keys and parameter names,
so config.json is read as plain JSON and mapped onto ``MPTArch``, and the weights are read as tensors only
(safetensors, or ``torch.load(weights_only=True)``); the folder's Python files are never imported. An option our
MPT cannot reproduce is a ConfigError naming it. Mixture-of-experts MPTs (ffn_type mb_moe, mb_dmoe, torch_dmoe) keep
their moe_* options and have their expert matrices moved from llm-foundry's layouts to ours
(layers.moe.expert_weight_from_llm_foundry).
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PretrainedConfig

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.models.layers.moe import expert_weight_from_llm_foundry
from llmfoundry.models.layers.moe_keys import MOE_KEYS, is_moe
from llmfoundry.models.mpt.arch import ARCH_KEYS, MPTArch

# Keys that only an llm-foundry MPTConfig writes (transformers' MptConfig has none of them).
_LLM_FOUNDRY_ONLY_KEYS = ("ffn_config", "norm_eps", "fc_type", "init_config", "auto_map")
# MPTArch keys that say how the model is initialised or run, not what it computes (the caller's values apply).
_RUN_TIME = {"init_config", "init_device", "use_cache"}
# Other config.json keys that say how the model was stored or trained (transformers' bookkeeping included).
_BOOKKEEPING = ({
    "model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "name_or_path", "verbose", "tokenizer_name", "name", "loss_fn", "bos_token_id", "eos_token_id", "pad_token_id",
} | set(PretrainedConfig().to_dict())) - set(ARCH_KEYS)  # fmt: skip
# llm-foundry attention keys our MPT lacks: (is the value the one that turns it off?, what our MPT lacks).
_ATTN_OFF = {
    "prefix_lm": (lambda v: not v, "prefix-LM attention (an option of older llm-foundry)"),
    "seq_parallel_world_size": (lambda v: v in (None, 1), "sequence parallelism (llm-foundry refuses it too)"),
    "attn_temperature_tuning": (lambda v: not v or not v.get("attn_scale"), "attention temperature tuning"),
}
# MegaBlocks keys an MoE's ffn_config may hold that say how it was trained, not what it computes: the expert-parallel
# ranks (moe_world_size, device_mesh: the caller's values apply) and those its load-balancing loss is averaged over.
_MOE_TRAINING_ONLY = ("moe_world_size", "device_mesh", "lbl_process_group")
# Names llm-foundry gives the unfused q/k/v projections (attn_config.fused_qkv: false) -> ours.
_UNFUSED_QKV = {".attn.Wq.": ".attn.q_proj.", ".attn.Wk.": ".attn.k_proj.", ".attn.Wv.": ".attn.v_proj."}


def is_llm_foundry_mpt(config: dict[str, Any]) -> bool:
    """Whether a config.json (as a dict) is llm-foundry's MPTConfig rather than transformers' MptConfig."""
    if config.get("model_type") != "mpt":
        return False
    return "MPTForCausalLM" in (config.get("architectures") or []) or any(k in config for k in _LLM_FOUNDRY_ONLY_KEYS)


def arch_from_llm_foundry(config: dict[str, Any], source: str, **overrides: Any) -> MPTArch:
    """The MPTArch of llm-foundry's config.json ``config`` (read from ``source``), with run-time ``overrides``
    (``attn_config`` a dict of its own) applied, validated; ConfigError naming every option it cannot hold."""
    problems: list[str] = []
    values = {k: v for k, v in config.items() if k in ARCH_KEYS and k not in _RUN_TIME}
    problems += [f"{k}: {v!r} is not an llm-foundry MPT option that mpt_causal_lm knows (remove it from "
                 "config.json if it does not change the network)"
                 for k, v in config.items() if k not in ARCH_KEYS and k not in _BOOKKEEPING]  # fmt: skip
    if values.get("fc_type") == {"name": "torch"}:
        values["fc_type"] = "torch"
    attn = _attn_values(dict(values.get("attn_config") or {}), problems)
    values["attn_config"] = {**attn, **overrides.pop("attn_config", {})}
    values["ffn_config"] = _ffn_values(dict(values.get("ffn_config") or {}), values.get("fc_type", "torch"), problems)
    if attn.get("alibi") or attn.get("rope"):
        values["learned_pos_emb"] = False  # llm-foundry's rule: ALiBi and RoPE replace learned positions
    head_dim, d_model, n_heads = values.get("head_dim"), values.get("d_model", 2048), values.get("n_heads", 16)
    if attn.get("rope") and attn.get("rope_impl", "dail") == "dail" and head_dim not in (None, d_model // n_heads):
        problems.append(f"head_dim: {head_dim} with attn_config.rope_impl: dail, where llm-foundry rotates "
                        f"d_model // n_heads = {d_model // n_heads} dimensions of each head, is not supported")
    if problems:
        raise ConfigError.many([f"{source}: {p}" for p in problems])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the NoPE warning: llm-foundry gave it when the model was made
            return validate({**values, **overrides}, MPTArch, "model")
    except ConfigError as error:  # e.g. a key of attn_config / ffn_config that our MPT does not have
        raise ConfigError.many([f"{source}: {p.removeprefix('model.')}" for p in error.problems]) from None


def _attn_values(attn: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    attn.pop("attn_impl", None)  # how attention runs, not what it computes: the caller's (or our default) applies
    for key, (is_off, lacking) in _ATTN_OFF.items():
        if key in attn:
            value = attn.pop(key)
            if not is_off(value):
                problems.append(f"attn_config.{key}: {value!r} cannot be imported: mpt_causal_lm has no {lacking}, "
                                "so the model would compute something else")
    if attn.get("attn_type", "multihead_attention") != "grouped_query_attention":
        attn.pop("kv_n_heads", None)  # llm-foundry reads it for grouped_query_attention only
    if not (attn.get("rope") and attn.get("rope_impl", "dail") == "hf"):
        attn.pop("rope_hf_config", None)  # llm-foundry reads the scaling for rope_impl hf only
    if "rope_theta" in attn:
        attn["rope_theta"] = float(attn["rope_theta"])
    return attn


def _ffn_values(ffn: dict[str, Any], fc_type: Any, problems: list[str]) -> dict[str, Any]:
    fc = ffn.pop("fc_type", None)  # llm-foundry copies the top-level fc_type here
    if fc is not None and fc not in (fc_type, {"name": fc_type}):
        problems.append(f"ffn_config.fc_type: {fc!r} differs from fc_type {fc_type!r}; mpt_causal_lm has one fc_type")
    known = {"ffn_type", "ffn_hidden_size", "ffn_act_fn"}
    if is_moe(ffn.get("ffn_type", "")):
        known |= {key for key, _ in MOE_KEYS}
        for key in _MOE_TRAINING_ONLY:
            ffn.pop(key, None)
        if ffn.pop("return_bias", False):  # llm-foundry sets it false: the output bias is added inside the layer
            problems.append("ffn_config.return_bias: True cannot be imported: mpt_causal_lm's MoE adds its output "
                            "bias itself (llm-foundry writes false)")
        if ffn.get("ffn_type") == "mb_moe":
            ffn.pop("mlp_type", None)  # MegaBlocks' MoE (mb_moe) ignores it: its experts are MLPs (w1, w2)
    for key in sorted(set(ffn) - known):  # TransformerEngine and MegaBlocks options our MPT lacks
        problems.append(f"ffn_config.{key}: {ffn[key]!r} cannot be imported: mpt_causal_lm has dense mptmlp and "
                        "mptglu FFNs and a dropless mixture of experts with the moe_* options of its config "
                        "reference only (no TransformerEngine layers or other MegaBlocks options)")
    return {k: v for k, v in ffn.items() if k in known}


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's weights: model.safetensors or pytorch_model.bin, or the shards an
    index file lists. ``.bin`` files are read with ``weights_only=True``: tensors and plain values, never code."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, AttributeError) as error:
                raise ConfigError(f"{index}: not a weight index with a weight_map ({first_line(error)})") from None
            outside = [shard for shard in shards if Path(shard).name != shard]
            if outside:
                raise ConfigError(f"{index}: shard '{outside[0]}' is not a file name in the folder")
            return {k: v for shard in shards for k, v in _read_weight_file(path / shard).items()}
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return _read_weight_file(path / name)
    raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin (nor an index of shards) in the folder")


def _read_weight_file(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise ConfigError(f"{file}: listed in the folder's weight index but missing")
    try:
        if file.suffix == ".safetensors":
            return load_file(file, device="cpu")
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, OSError) as error:
        raise ConfigError(f"{file}: cannot be read as tensors ({first_line(error)}); a file that needs code to "
                          "unpickle is never run") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{file}: expected a dict of tensors (a state dict)")
    return state


def state_from_llm_foundry(arch: MPTArch, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """llm-foundry's MPT parameter names -> ours (the same but for unfused q/k/v); a tied head has no lm_head; an
    MoE's expert matrices from llm-foundry's layout of its ffn_type to ours (layers.moe)."""
    ours = {}
    ffn_type = arch.ffn_config.ffn_type
    experts = (arch.ffn_config.moe_num_experts, arch.ffn_hidden, arch.d_model)
    for name, tensor in state.items():
        for theirs, mine in _UNFUSED_QKV.items():
            name = name.replace(theirs, mine)
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # the same tensor as transformer.wte.weight
        ours[name] = expert_weight_from_llm_foundry(name, tensor, ffn_type, experts, "weight")
    return ours
