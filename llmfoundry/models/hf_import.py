"""Import transformers models into our MPT: the way back from llmfoundry.models.hf_export's export.

A folder holding our own MPT (``model_type: llmfoundry_mpt``) opens with ``MPTForCausalLM.from_pretrained``;
llm-foundry's own MPT exports (``model_type: mpt`` with llm-foundry's MPTConfig) are read as JSON and tensors by
llmfoundry.models.llm_foundry_mpt, never with their Python files; transformers' ``MptForCausalLM``,
``LlamaForCausalLM``, ``GPT2LMHeadModel`` and ``DbrxForCausalLM`` (a mixture of experts: our ``mb_dmoe`` with
GLU experts) are read with transformers and their weights mapped onto the MPT architecture that computes the
same function. An option of the source that our MPT cannot reproduce is a
ConfigError, never a silently different model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.models.hf_export import (
    DBRX_BLOCK_TENSORS,
    DBRX_EPS,
    DBRX_EXPERT_TENSORS,
    DBRX_NO_CLIP,
    GPT2_BLOCK_LAYERS,
)
from llmfoundry.models.layers.rope_scaling import ROPE_SCALING_KEYS
from llmfoundry.models.llm_foundry_mpt import (
    arch_from_llm_foundry,
    is_llm_foundry_mpt,
    read_weights,
    state_from_llm_foundry,
)
from llmfoundry.models.mpt.arch import MPTArch
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

# transformers' ACT2FN names -> activation spec (ffn_config.ffn_act_fn)
_HF_TO_ACT = {"gelu": {"name": "gelu"}, "gelu_pytorch_tanh": {"name": "gelu", "approximate": "tanh"},
              "gelu_new": {"name": "gelu", "approximate": "tanh"},
              "silu": {"name": "silu"}, "swish": {"name": "silu"}, "relu": {"name": "relu"}}  # fmt: skip


def _mpt_options_transformers_drops(config, attn) -> list[str]:
    """Options of an llm-foundry-style MPT config.json that transformers' MptForCausalLM silently ignores (it is
    always ALiBi, multi-head, bias-free, LayerNorm, GELU MLP of width 4 * d_model)."""
    ffn = getattr(config, "ffn_config", None) or {}
    checks = [
        ("no_bias", getattr(config, "no_bias", True), True),
        ("expansion_ratio", getattr(config, "expansion_ratio", 4), 4),
        ("logit_scale", getattr(config, "logit_scale", None), None),
        ("attn_config.alibi", attn("alibi", True), True),
        ("attn_config.attn_type", attn("attn_type", "multihead_attention"), "multihead_attention"),
        ("attn_config.qk_ln", attn("qk_ln", False), False),
        ("attn_config.qk_gn", attn("qk_gn", False), False),
        ("attn_config.prefix_lm", attn("prefix_lm", False), False),
        ("attn_config.rope", attn("rope", False), False),
        ("ffn_config.ffn_type", ffn.get("ffn_type", "mptmlp") if isinstance(ffn, dict) else "mptmlp", "mptmlp"),
    ]
    lost = [f"{key}: {value}" for key, value, expected in checks if value != expected]
    if getattr(config, "norm_type", "low_precision_layernorm") not in ("layernorm", "low_precision_layernorm"):
        lost.append(f"norm_type: {config.norm_type}")
    return lost


def arch_from_transformers(config, **overrides: Any) -> MPTArch:
    """The MPT architecture equivalent to a transformers MptConfig, LlamaConfig, GPT2Config or DbrxConfig (ConfigError
    otherwise), with ``overrides`` (run-time options; ``attn_config`` a dict of its own) applied, then validated."""
    values = _mpt_values(config)
    attn_config = {**values.pop("attn_config", {}), **overrides.pop("attn_config", {})}
    return validate({**values, **overrides, "attn_config": attn_config}, MPTArch, "model")


def _mpt_values(config) -> dict[str, Any]:
    """MPT config values that describe the network of a transformers config."""
    kind = getattr(config, "model_type", None)
    if kind == "mpt":
        a = config.attn_config
        get = (lambda k, d=None: a.get(k, d)) if isinstance(a, dict) else (lambda k, d=None: getattr(a, k, d))
        lost = _mpt_options_transformers_drops(config, get)
        if lost:
            raise ConfigError(f"model: this MPT config sets {', '.join(lost)}, which transformers' MptForCausalLM "
                              "does not implement, so the import would change the model; load the llm-foundry "
                              "folder itself (load_as_mpt reads its config.json and weights)")
        return dict(
            d_model=config.d_model, n_heads=config.n_heads, n_layers=config.n_layers, expansion_ratio=4,
            max_seq_len=config.max_seq_len, vocab_size=config.vocab_size, norm_eps=config.layer_norm_epsilon,
            learned_pos_emb=False, no_bias=True, norm_type="low_precision_layernorm",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            attn_config={"alibi": True, "alibi_bias_max": get("alibi_bias_max", 8), "clip_qkv": get("clip_qkv"),
                         "softmax_scale": get("softmax_scale")},
        )  # fmt: skip
    if kind == "gpt2":
        if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(config, "add_cross_attention", False):
            raise ConfigError("model: GPT-2 variants with scale_attn_by_inverse_layer_idx or cross-attention cannot "
                              "be imported as mpt_causal_lm")
        if config.activation_function not in _HF_TO_ACT:
            raise ConfigError(f"model: activation '{config.activation_function}' is not supported by mpt_causal_lm")
        return dict(
            d_model=config.n_embd, n_heads=config.n_head, n_layers=config.n_layer, max_seq_len=config.n_positions,
            vocab_size=config.vocab_size, norm_eps=config.layer_norm_epsilon, learned_pos_emb=True, no_bias=False,
            norm_type="layernorm", tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            ffn_config={"ffn_type": "mptmlp", "ffn_hidden_size": config.n_inner or 4 * config.n_embd,
                        "ffn_act_fn": _HF_TO_ACT[config.activation_function]},
        )  # fmt: skip
    if kind == "dbrx":
        return _dbrx_values(config)
    if kind == "llama":
        if config.hidden_act not in _HF_TO_ACT:
            raise ConfigError(f"model: activation '{config.hidden_act}' is not supported by mpt_causal_lm")
        n_heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        attn = _rope_attn(config)
        if kv != n_heads:
            attn.update(attn_type="grouped_query_attention", kv_n_heads=kv)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        return dict(
            d_model=config.hidden_size, n_heads=n_heads, n_layers=config.num_hidden_layers,
            head_dim=None if head_dim * n_heads == config.hidden_size else head_dim,
            max_seq_len=config.max_position_embeddings, vocab_size=config.vocab_size, norm_eps=config.rms_norm_eps,
            learned_pos_emb=False, no_bias=not getattr(config, "mlp_bias", False),
            attention_bias=bool(getattr(config, "attention_bias", False)), norm_type="rmsnorm",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)), attn_config=attn,
            ffn_config={"ffn_type": "mptglu", "ffn_hidden_size": config.intermediate_size,
                        "ffn_act_fn": _HF_TO_ACT[config.hidden_act]},
        )  # fmt: skip
    raise ConfigError(f"model: cannot import a '{kind}' model as mpt_causal_lm (supported: mpt, llama, gpt2, dbrx; "
                      "use model.name: hf_causal_lm for other architectures)")  # fmt: skip


def _rope_attn(config) -> dict[str, Any]:
    """attn_config values for the RoPE of a transformers config's rope_parameters (Llama's and DBRX's)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    kind = {"default": "no_scaling"}.get(rope.get("rope_type", "default"), rope.get("rope_type"))
    if kind not in ROPE_SCALING_KEYS or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"model: RoPE scaling '{rope.get('rope_type')}' is not supported by mpt_causal_lm")
    attn = {"rope": True, "rope_theta": float(rope.get("rope_theta", 10000.0))}
    if kind != "no_scaling":  # scaling is read with rope_impl hf, as in llm-foundry
        scaling = {k: v for k, v in rope.items() if k in ROPE_SCALING_KEYS[kind] and v is not None}
        attn.update(rope_impl="hf", rope_hf_config={"type": kind, **scaling})
    return attn


def _dbrx_values(config) -> dict[str, Any]:
    """DBRX: RoPE, fused Wqkv (clip_qkv, kv_n_heads), bias-free LayerNorms, an untied head, dropless top-k MoE
    with GLU experts (MegaBlocks' dmoe, which DBRX was trained with)."""
    a, f = config.attn_config, config.ffn_config
    attn = _rope_attn(config)
    stored_theta = getattr(a, "rope_theta", None)  # DBRX's own key; transformers 5's rotary tables read rope_parameters
    if stored_theta is not None and float(stored_theta) != attn["rope_theta"]:
        raise ConfigError(f"model: this DBRX config's attn_config.rope_theta ({stored_theta}) differs from "
                          f"rope_parameters.rope_theta ({attn['rope_theta']}), which transformers uses; set both to "
                          "the value the model was trained with in its config.json")
    act = (f.ffn_act_fn or {}).get("name", "silu")
    if act not in _HF_TO_ACT:
        raise ConfigError(f"model: activation '{act}' is not supported by mpt_causal_lm")
    if a.kv_n_heads != config.n_heads:
        attn.update(attn_type="grouped_query_attention", kv_n_heads=a.kv_n_heads)
    clip = None if a.clip_qkv is None or a.clip_qkv >= DBRX_NO_CLIP else a.clip_qkv  # our export's "no clipping"
    attn.update(clip_qkv=clip, attn_pdrop=a.attn_pdrop)
    norm = f.moe_normalize_expert_weights
    return dict(
        d_model=config.d_model, n_heads=config.n_heads, n_layers=config.n_layers, max_seq_len=config.max_seq_len,
        vocab_size=config.vocab_size, norm_eps=DBRX_EPS, learned_pos_emb=False, no_bias=True, norm_type="layernorm",
        tie_word_embeddings=False, resid_pdrop=config.resid_pdrop or 0.0, emb_pdrop=config.emb_pdrop or 0.0,
        attn_config=attn,
        ffn_config={"ffn_type": "mb_dmoe", "mlp_type": "glu", "ffn_hidden_size": f.ffn_hidden_size,
                    "ffn_act_fn": _HF_TO_ACT[act], "moe_num_experts": f.moe_num_experts, "moe_top_k": f.moe_top_k,
                    "moe_jitter_eps": f.moe_jitter_eps, "moe_loss_weight": f.moe_loss_weight,
                    "moe_normalize_expert_weights": norm},
    )  # fmt: skip


def from_transformers(hf_model: nn.Module, **arch_overrides: Any) -> MPTForCausalLM:
    """Our MPTForCausalLM with the weights of a transformers MptForCausalLM, LlamaForCausalLM, GPT2LMHeadModel or
    DbrxForCausalLM."""
    overrides = {**arch_overrides, "init_device": "cpu",  # the weights are copied in right away
                 "attn_config": {**arch_overrides.get("attn_config", {}), "fused_qkv": True}}  # they come fused
    arch = arch_from_transformers(hf_model.config, **overrides)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    kind = hf_model.config.model_type
    if kind == "mpt":  # our parameter names are transformers' MPT names
        ours = {k: v for k, v in state.items() if not (k == "lm_head.weight" and arch.tie_word_embeddings)}
    else:
        ours = {"gpt2": _state_from_gpt2, "dbrx": _state_from_dbrx}.get(kind, _state_from_llama)(arch, state)
    return _model_with_state(arch, ours)


def _model_with_state(arch: MPTArch, state: dict[str, torch.Tensor], source: str = "model") -> MPTForCausalLM:
    """Our MPT of ``arch`` holding exactly the tensors of ``state`` (in their dtype), in eval mode."""
    with torch.device("meta"):  # no initialisation: every parameter is loaded right away
        model = MPTForCausalLM.from_arch(arch)
    model.to_empty(device="cpu")
    model.to(next(iter(state.values())).dtype)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(f"{source}: the weights do not match the architecture its config describes (missing: "
                          f"{', '.join(missing[:3]) or 'none'}; unexpected: {', '.join(unexpected[:3]) or 'none'})")
    model.load_state_dict(state, strict=True)
    return model.eval()


def _outer_state(arch: MPTArch, state: dict, embed: str, norm_f: str) -> dict:
    """Our embedding, final norm and (untied) head from a transformers state dict's names for them."""
    ours = {"transformer.wte.weight": state[f"{embed}.weight"]}
    for kind in ("weight", "bias"):
        if f"{norm_f}.{kind}" in state:
            ours[f"transformer.norm_f.{kind}"] = state[f"{norm_f}.{kind}"]
    if not arch.tie_word_embeddings:
        ours["lm_head.weight"] = state["lm_head.weight"]
    return ours


def _state_from_gpt2(arch: MPTArch, state: dict) -> dict:
    ours = _outer_state(arch, state, "transformer.wte", "transformer.ln_f")
    ours["transformer.wpe.weight"] = state["transformer.wpe.weight"]
    for i in range(arch.n_layers):
        src, dst = f"transformer.h.{i}.", f"transformer.blocks.{i}."
        for mine, theirs, transposed in GPT2_BLOCK_LAYERS:
            weight = state[src + f"{theirs}.weight"]
            ours[dst + f"{mine}.weight"] = weight.t().contiguous() if transposed else weight
            ours[dst + f"{mine}.bias"] = state[src + f"{theirs}.bias"]
    return ours


def _state_from_llama(arch: MPTArch, state: dict) -> dict:
    ours = _outer_state(arch, state, "model.embed_tokens", "model.norm")
    for i in range(arch.n_layers):
        src, dst = f"model.layers.{i}.", f"transformer.blocks.{i}."
        ours[dst + "norm_1.weight"] = state[src + "input_layernorm.weight"]
        ours[dst + "norm_2.weight"] = state[src + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias"):
            qkv = [state.get(src + f"self_attn.{n}_proj.{kind}") for n in "qkv"]
            if qkv[0] is not None:
                ours[dst + f"attn.Wqkv.{kind}"] = torch.cat(qkv)
            for theirs, mine in (("self_attn.o_proj", "attn.out_proj"), ("mlp.gate_proj", "ffn.gate_proj"),
                                 ("mlp.up_proj", "ffn.up_proj"), ("mlp.down_proj", "ffn.down_proj")):  # fmt: skip
                if src + f"{theirs}.{kind}" in state:
                    ours[dst + f"{mine}.{kind}"] = state[src + f"{theirs}.{kind}"]
    return ours


def _state_from_dbrx(arch: MPTArch, state: dict) -> dict:
    ours = _outer_state(arch, state, "transformer.wte", "transformer.norm_f")
    experts = (arch.ffn_config.moe_num_experts, arch.ffn_hidden, arch.d_model)
    for i in range(arch.n_layers):
        block = f"transformer.blocks.{i}."  # the same prefix in both
        for mine, theirs in DBRX_BLOCK_TENSORS:
            ours[block + mine] = state[block + theirs]
        for name in DBRX_EXPERT_TENSORS:  # (experts * hidden, d_model) -> (experts, hidden, d_model)
            ours[block + name] = state[block + name].reshape(experts)
    return ours


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{path}: no config.json (not a Hugging Face model folder)")
    try:
        return json.loads(config_file.read_text())
    except ValueError as error:
        raise ConfigError(f"{config_file}: not valid JSON ({first_line(error)})") from None


def is_llm_foundry_mpt_folder(path: str | Path) -> bool:
    """Whether ``path`` holds llm-foundry's own MPT export, which only load_as_mpt reads (transformers'
    MptForCausalLM cannot, and its Python files are never run)."""
    return (Path(path) / "config.json").is_file() and is_llm_foundry_mpt(_read_config(Path(path)))


def load_as_mpt(path: str | Path, overrides: dict | None = None, attn_overrides: dict | None = None) -> MPTForCausalLM:
    """Our MPT from a folder holding our MPT, llm-foundry's MPT, or transformers' MPT, Llama, GPT-2 or DBRX.

    ``overrides`` / ``attn_overrides`` replace run-time options (attn_impl, dropouts, init_device) of the stored
    architecture.
    """
    path = Path(path)
    overrides, attn_overrides = dict(overrides or {}), dict(attn_overrides or {})
    values = _read_config(path)
    if values.get("model_type") == MPTConfig.model_type:
        # The run-time options replace the stored ones before the values are parsed and validated, once.
        values.update(overrides)
        values["attn_config"] = {**(values.get("attn_config") or {}), **attn_overrides}
        if values.get("init_device") == "meta":
            values["init_device"] = "cpu"  # from_pretrained materialises the weights anyway
        return MPTForCausalLM.from_pretrained(path, config=MPTConfig(**values))
    overrides.pop("init_device", None)  # the weights are loaded into a CPU model right away
    if is_llm_foundry_mpt(values):
        # llm-foundry's MPTConfig may describe RoPE, GQA, GLU, ... that transformers' MptConfig cannot hold
        arch = arch_from_llm_foundry(values, str(path / "config.json"), **overrides, init_device="cpu",
                                     attn_config=attn_overrides)
        return _model_with_state(arch, state_from_llm_foundry(arch, read_weights(path)), str(path))
    hf_model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False)
    return from_transformers(hf_model, **overrides, attn_config=attn_overrides)
