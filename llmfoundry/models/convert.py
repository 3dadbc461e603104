"""Hugging Face interop: export our MPT to transformers' own classes, import them back, open any model folder.

Export picks the transformers class that can express the architecture:

* ``MptForCausalLM`` for ALiBi + multi-head attention + exact-GELU MLP (4x) + bias-free LayerNorm;
* ``LlamaForCausalLM`` for RoPE + RMSNorm + gated MLP (SwiGLU or another activation), with any kv_n_heads;
* ``GPT2LMHeadModel`` for learned positions + multi-head attention + LayerNorm + MLP (llm-foundry's default MPT
  architecture, with or without biases: missing biases are exported as zeros).

Anything else is a ConfigError that names each option that stands in the way, because a silently different
exported model is worse than none. Our parameter names already match transformers' MPT, so the MPT mapping is
the identity; the Llama one splits the fused Wqkv into q/k/v projections.

``llmfoundry convert`` (llmfoundry.commands.convert) runs ``export_hf`` on a loaded model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.mpt.config import MPTArch, MPTConfig, from_dict, to_dict
from llmfoundry.models.mpt.model import MPTForCausalLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# activation spec (ffn_config.ffn_act_fn) <-> transformers' ACT2FN names
_ACT_TO_HF = {("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_pytorch_tanh", ("gelu_tanh", "none"): "gelu_pytorch_tanh",
              ("silu", "none"): "silu", ("relu", "none"): "relu"}  # fmt: skip
_HF_TO_ACT = {"gelu": {"name": "gelu"}, "gelu_pytorch_tanh": {"name": "gelu", "approximate": "tanh"},
              "gelu_new": {"name": "gelu", "approximate": "tanh"},
              "silu": {"name": "silu"}, "swish": {"name": "silu"}, "relu": {"name": "relu"}}  # fmt: skip


def _act(arch: MPTArch) -> tuple[str, str]:
    spec = arch.ffn_config.ffn_act_fn or {"name": "gelu" if arch.ffn_config.ffn_type == "mptmlp" else "silu"}
    return spec.get("name"), spec.get("approximate", "none")


# -- what each transformers class can express ----------------------------------------------------------------

def _common_problems(arch: MPTArch, target: str) -> list[str]:
    a, p = arch.attn_config, "model"
    problems = []
    checks = [
        (a.qk_ln, "attn_config.qk_ln", "true"),
        (a.qk_gn, "attn_config.qk_gn", "true"),
        (a.sliding_window_size != -1, "attn_config.sliding_window_size", a.sliding_window_size),
        (a.attn_logit_softcapping is not None, "attn_config.attn_logit_softcapping", a.attn_logit_softcapping),
        (arch.final_logit_softcapping is not None, "final_logit_softcapping", arch.final_logit_softcapping),
        (arch.logit_scale is not None, "logit_scale", arch.logit_scale),
    ]
    for bad, key, value in checks:
        if bad:
            problems.append(f"{p}.{key}: {target} cannot express {key.split('.')[-1]}={value}")
    return problems


def _multihead_problems(arch: MPTArch, t: str) -> list[str]:
    problems = []
    if arch.attn_config.attn_type != "multihead_attention":
        problems.append(f"model.attn_config.attn_type: {t} supports only multihead_attention, got "
                        f"{arch.attn_config.attn_type}")
    if arch.head_dim is not None and arch.head_dim * arch.n_heads != arch.d_model:
        problems.append(f"model.head_dim: {t} needs head_dim = d_model / n_heads")
    return problems


def _plain_attention_problems(arch: MPTArch, t: str) -> list[str]:
    """Attention that scales by 1/sqrt(head_dim) and does not clip (transformers' Llama and GPT-2)."""
    a, problems = arch.attn_config, []
    if a.clip_qkv is not None:
        problems.append(f"model.attn_config.clip_qkv: {t} cannot express clip_qkv={a.clip_qkv}")
    if a.softmax_scale is not None and not math.isclose(a.softmax_scale, arch.head_size**-0.5):
        problems.append(f"model.attn_config.softmax_scale: {t} always scales by 1/sqrt(head_dim)")
    return problems


def _ffn_problems(arch: MPTArch, t: str, ffn_type: str, what: str) -> list[str]:
    problems = []
    if arch.ffn_config.ffn_type != ffn_type:
        problems.append(f"model.ffn_config.ffn_type: {t} has {what} (use {ffn_type}), got {arch.ffn_config.ffn_type}")
    if _act(arch) not in _ACT_TO_HF:
        problems.append(f"model.ffn_config.ffn_act_fn: {t} has no activation {_act(arch)}")
    return problems


def _norm_problems(arch: MPTArch, t: str, norm: str) -> list[str]:
    if arch.norm_type.endswith(norm):
        return []
    return [f"model.norm_type: {t} uses {'RMSNorm' if norm == 'rmsnorm' else 'LayerNorm'}, got {arch.norm_type}"]


def mpt_export_problems(arch: MPTArch) -> list[str]:
    a, t = arch.attn_config, "transformers' MptForCausalLM"
    problems = _common_problems(arch, t) + _multihead_problems(arch, t) + _norm_problems(arch, t, "layernorm")
    if not a.alibi:
        problems.append(f"model.attn_config.alibi: {t} always uses ALiBi (got alibi=false)")
    if arch.learned_pos_emb:
        problems.append(f"model.learned_pos_emb: {t} has no learned position embeddings (set learned_pos_emb: false)")
    if arch.ffn_config.ffn_type != "mptmlp" or _act(arch) != ("gelu", "none"):
        problems.append(f"model.ffn_config: {t} supports only ffn_type mptmlp with exact gelu")
    if arch.ffn_hidden != 4 * arch.d_model:
        problems.append(f"model.expansion_ratio: {t} has a fixed 4x MLP, got hidden size {arch.ffn_hidden}")
    if not arch.no_bias or arch.qkv_bias:
        problems.append(f"model.no_bias: {t} has no biases (set no_bias: true)")
    return problems


def llama_export_problems(arch: MPTArch) -> list[str]:
    t = "transformers' LlamaForCausalLM"
    problems = _common_problems(arch, t) + _plain_attention_problems(arch, t)
    if arch.learned_pos_emb:
        problems.append(f"model.learned_pos_emb: {t} has no learned position embeddings")
    return problems + _ffn_problems(arch, t, "mptglu", "a gated MLP") + _norm_problems(arch, t, "rmsnorm")


def gpt2_export_problems(arch: MPTArch) -> list[str]:
    t = "transformers' GPT2LMHeadModel"
    return (_common_problems(arch, t) + _multihead_problems(arch, t) + _plain_attention_problems(arch, t)
            + _ffn_problems(arch, t, "mptmlp", "a plain MLP") + _norm_problems(arch, t, "layernorm"))


# our MPT block's layers <-> GPT-2's, and whether the weight is stored transposed (GPT-2's Conv1D is x @ W)
_GPT2_BLOCK = (("norm_1", "ln_1", False), ("attn.Wqkv", "attn.c_attn", True), ("attn.out_proj", "attn.c_proj", True),
               ("norm_2", "ln_2", False), ("ffn.up_proj", "mlp.c_fc", True), ("ffn.down_proj", "mlp.c_proj", True))


# -- export -------------------------------------------------------------------------------------------------

def to_transformers(model: MPTForCausalLM, *, eos_token_id=None, bos_token_id=None, pad_token_id=None) -> nn.Module:
    """A transformers-native model (MptForCausalLM, LlamaForCausalLM or GPT2LMHeadModel) with the same weights
    and outputs."""
    arch = model.arch
    tokens = dict(eos_token_id=eos_token_id, bos_token_id=bos_token_id, pad_token_id=pad_token_id)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if arch.learned_pos_emb:
        problems = gpt2_export_problems(arch)
        if problems:
            raise ConfigError.many(problems)
        hf_model = _gpt2_from_state(arch, state, tokens)
    elif arch.attn_config.rope:
        problems = llama_export_problems(arch)
        if problems:
            raise ConfigError.many(problems)
        hf_model = _llama_from_state(arch, state, tokens)
    else:
        problems = mpt_export_problems(arch)
        if problems:
            raise ConfigError.many(problems)
        hf_model = _mpt_from_state(arch, state, tokens)
    return hf_model.eval()


def _unfused_qkv(arch: MPTArch, state: dict[str, torch.Tensor], i: int, kind: str) -> tuple:
    """(q, k, v) weights (kind='weight') or biases of block i, whether or not the model fuses them."""
    prefix = f"transformer.blocks.{i}.attn."
    if arch.attn_config.fused_qkv:
        fused = state.get(prefix + f"Wqkv.{kind}")
        if fused is None:
            return None, None, None
        q_dim, kv_dim = arch.n_heads * arch.head_size, arch.kv_heads * arch.head_size
        return fused.split([q_dim, kv_dim, kv_dim], dim=0)
    return tuple(state.get(prefix + f"{n}_proj.{kind}") for n in "qkv")


def _mpt_from_state(arch: MPTArch, state: dict, tokens: dict) -> nn.Module:
    from transformers import MptConfig, MptForCausalLM

    a = arch.attn_config
    config = MptConfig(
        d_model=arch.d_model, n_heads=arch.n_heads, n_layers=arch.n_layers, expansion_ratio=4,
        max_seq_len=arch.max_seq_len, vocab_size=arch.vocab_size, layer_norm_epsilon=arch.norm_eps,
        learned_pos_emb=False, no_bias=True, norm_type="low_precision_layernorm",
        tie_word_embeddings=arch.tie_word_embeddings, use_cache=True,
        attn_config={"attn_type": "multihead_attention", "alibi": True, "alibi_bias_max": a.alibi_bias_max,
                     "clip_qkv": a.clip_qkv, "softmax_scale": a.softmax_scale},
        **tokens,
    )  # fmt: skip
    out = {}
    for name, tensor in state.items():
        if ".attn.q_proj." in name or ".attn.k_proj." in name or ".attn.v_proj." in name:
            continue
        out[name] = tensor
    if not a.fused_qkv:
        for i in range(arch.n_layers):
            out[f"transformer.blocks.{i}.attn.Wqkv.weight"] = torch.cat(_unfused_qkv(arch, state, i, "weight"))
    return _load_into(MptForCausalLM, config, out)


def _llama_from_state(arch: MPTArch, state: dict, tokens: dict) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.d_model, intermediate_size=arch.ffn_hidden,
        num_hidden_layers=arch.n_layers, num_attention_heads=arch.n_heads, num_key_value_heads=arch.kv_heads,
        head_dim=arch.head_size, hidden_act=_ACT_TO_HF[_act(arch)], max_position_embeddings=arch.max_seq_len,
        rms_norm_eps=arch.norm_eps, tie_word_embeddings=arch.tie_word_embeddings, attention_bias=arch.qkv_bias,
        mlp_bias=not arch.no_bias, rope_parameters={"rope_type": "default", "rope_theta": float(arch.attn_config.rope_theta)},
        use_cache=True, **tokens,
    )  # fmt: skip
    out = {"model.embed_tokens.weight": state["transformer.wte.weight"], "model.norm.weight": state["transformer.norm_f.weight"]}
    if "lm_head.weight" in state:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(arch.n_layers):
        src, dst = f"transformer.blocks.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = state[src + "norm_1.weight"]
        out[dst + "post_attention_layernorm.weight"] = state[src + "norm_2.weight"]
        for kind in ("weight", "bias"):
            q, k, v = _unfused_qkv(arch, state, i, kind)
            if q is not None:
                out[dst + f"self_attn.q_proj.{kind}"] = q
                out[dst + f"self_attn.k_proj.{kind}"] = k
                out[dst + f"self_attn.v_proj.{kind}"] = v
            for ours, theirs in (("attn.out_proj", "self_attn.o_proj"), ("ffn.gate_proj", "mlp.gate_proj"),
                                 ("ffn.up_proj", "mlp.up_proj"), ("ffn.down_proj", "mlp.down_proj")):  # fmt: skip
                if src + f"{ours}.{kind}" in state:
                    out[dst + f"{theirs}.{kind}"] = state[src + f"{ours}.{kind}"]
    return _load_into(LlamaForCausalLM, config, out)


def _gpt2_from_state(arch: MPTArch, state: dict, tokens: dict) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=arch.vocab_size, n_positions=arch.max_seq_len, n_embd=arch.d_model, n_layer=arch.n_layers,
        n_head=arch.n_heads, n_inner=arch.ffn_hidden, activation_function=_ACT_TO_HF[_act(arch)],
        layer_norm_epsilon=arch.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=arch.tie_word_embeddings, use_cache=True, **tokens,
    )  # fmt: skip
    zeros = lambda n: torch.zeros(n, dtype=state["transformer.wte.weight"].dtype)  # noqa: E731
    out = {"transformer.wte.weight": state["transformer.wte.weight"],
           "transformer.wpe.weight": state["transformer.wpe.weight"],
           "transformer.ln_f.weight": state["transformer.norm_f.weight"],
           "transformer.ln_f.bias": state.get("transformer.norm_f.bias", zeros(arch.d_model))}  # fmt: skip
    if "lm_head.weight" in state:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(arch.n_layers):
        src, dst = f"transformer.blocks.{i}.", f"transformer.h.{i}."
        layers = dict(state)
        for kind in ("weight", "bias"):  # one fused qkv projection, as GPT-2's c_attn
            q, k, v = _unfused_qkv(arch, state, i, kind)
            if q is not None:
                layers[src + f"attn.Wqkv.{kind}"] = torch.cat([q, k, v])
        for ours, theirs, transposed in _GPT2_BLOCK:
            weight = layers[src + f"{ours}.weight"]
            out[dst + f"{theirs}.weight"] = weight.t().contiguous() if transposed else weight
            out[dst + f"{theirs}.bias"] = layers.get(src + f"{ours}.bias", zeros(weight.shape[0]))
    return _load_into(GPT2LMHeadModel, config, out)


def _load_into(cls, config, state: dict) -> nn.Module:
    with torch.device("meta"):
        model = cls(config)
    model.to_empty(device="cpu")
    dtype = next(iter(state.values())).dtype
    model.to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied heads and non-persistent buffers (rotary inv_freq) are not in the state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping to {cls.__name__} is incomplete: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    for module in model.modules():
        if hasattr(module, "compute_default_rope_parameters"):  # to_empty left the rotary tables uninitialised
            inv_freq, _ = module.compute_default_rope_parameters(module.config)
            module.inv_freq.copy_(inv_freq)
            module.original_inv_freq.copy_(inv_freq)
    return model


def export_hf(model: nn.Module, tokenizer, out_dir: str | Path, dtype: str = "fp32") -> str:
    """Write ``model`` as a transformers-native folder (safetensors + config + tokenizer); returns the class name.

    ``model`` is our MPTForCausalLM or an hf_causal_lm wrapper (its inner model is saved; LoRA adapters are
    merged into the weights in place, so export a model you no longer train).
    """
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype: expected one of {', '.join(DTYPES)}, got '{dtype}'")
    out_dir = Path(out_dir)
    tokens = {}
    if tokenizer is not None:
        tokens = dict(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                      pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    hf_model = getattr(model, "hf_model", model)  # unwrap hf_causal_lm
    if hasattr(hf_model, "merge_and_unload"):  # a peft model: fold the adapters into the weights
        hf_model = hf_model.merge_and_unload()
    if isinstance(hf_model, MPTForCausalLM):
        hf_model = to_transformers(hf_model, **tokens)
    hf_model = hf_model.to(DTYPES[dtype])
    for key, value in tokens.items():  # so that generate() knows when to stop and how to pad
        if value is not None:
            setattr(hf_model.generation_config, key, value)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return type(hf_model).__name__


# -- import -------------------------------------------------------------------------------------------------

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


def arch_from_transformers(config) -> MPTArch:
    """The MPT architecture equivalent to a transformers MptConfig or LlamaConfig (ConfigError otherwise)."""
    kind = getattr(config, "model_type", None)
    if kind == "mpt":
        a = config.attn_config
        get = (lambda k, d=None: a.get(k, d)) if isinstance(a, dict) else (lambda k, d=None: getattr(a, k, d))
        lost = _mpt_options_transformers_drops(config, get)
        if lost:
            raise ConfigError(f"model: this MPT config.json sets {', '.join(lost)}, which transformers' "
                              "MptForCausalLM (used to read its weights) does not implement, so the import would "
                              "change the model; convert from the llm-foundry checkpoint it came from instead")
        return from_dict(MPTArch, dict(
            d_model=config.d_model, n_heads=config.n_heads, n_layers=config.n_layers, expansion_ratio=4,
            max_seq_len=config.max_seq_len, vocab_size=config.vocab_size, norm_eps=config.layer_norm_epsilon,
            learned_pos_emb=False, no_bias=True, norm_type="low_precision_layernorm",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            attn_config={"alibi": True, "alibi_bias_max": get("alibi_bias_max", 8), "clip_qkv": get("clip_qkv"),
                         "softmax_scale": get("softmax_scale")},
        ), "model")  # fmt: skip
    if kind == "gpt2":
        if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(config, "add_cross_attention", False):
            raise ConfigError("model: GPT-2 variants with scale_attn_by_inverse_layer_idx or cross-attention cannot "
                              "be imported as mpt_causal_lm")
        if config.activation_function not in _HF_TO_ACT:
            raise ConfigError(f"model: activation '{config.activation_function}' is not supported by mpt_causal_lm")
        return from_dict(MPTArch, dict(
            d_model=config.n_embd, n_heads=config.n_head, n_layers=config.n_layer, max_seq_len=config.n_positions,
            vocab_size=config.vocab_size, norm_eps=config.layer_norm_epsilon, learned_pos_emb=True, no_bias=False,
            norm_type="layernorm", tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            ffn_config={"ffn_type": "mptmlp", "ffn_hidden_size": config.n_inner or 4 * config.n_embd,
                        "ffn_act_fn": _HF_TO_ACT[config.activation_function]},
        ), "model")  # fmt: skip
    if kind == "llama":
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise ConfigError(f"model: RoPE scaling '{rope.get('rope_type')}' is not supported by mpt_causal_lm")
        if config.hidden_act not in _HF_TO_ACT:
            raise ConfigError(f"model: activation '{config.hidden_act}' is not supported by mpt_causal_lm")
        n_heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        attn = {"rope": True, "rope_theta": float(rope.get("rope_theta", 10000.0))}
        if kv != n_heads:
            attn.update(attn_type="grouped_query_attention", kv_n_heads=kv)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        return from_dict(MPTArch, dict(
            d_model=config.hidden_size, n_heads=n_heads, n_layers=config.num_hidden_layers,
            head_dim=None if head_dim * n_heads == config.hidden_size else head_dim,
            max_seq_len=config.max_position_embeddings, vocab_size=config.vocab_size, norm_eps=config.rms_norm_eps,
            learned_pos_emb=False, no_bias=not getattr(config, "mlp_bias", False),
            attention_bias=bool(getattr(config, "attention_bias", False)), norm_type="rmsnorm",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)), attn_config=attn,
            ffn_config={"ffn_type": "mptglu", "ffn_hidden_size": config.intermediate_size,
                        "ffn_act_fn": _HF_TO_ACT[config.hidden_act]},
        ), "model")  # fmt: skip
    raise ConfigError(f"model: cannot import a '{kind}' model as mpt_causal_lm (supported: mpt, llama, gpt2; "
                      "use model.name: hf_causal_lm for other architectures)")  # fmt: skip


def from_transformers(hf_model: nn.Module, **arch_overrides: Any) -> MPTForCausalLM:
    """Our MPTForCausalLM with the weights of a transformers MptForCausalLM, LlamaForCausalLM or GPT2LMHeadModel."""
    arch = arch_from_transformers(hf_model.config)
    values = to_dict(arch)
    attn_overrides = arch_overrides.pop("attn_config", {})
    values.update(arch_overrides)
    values["attn_config"].update(attn_overrides)
    arch = from_dict(MPTArch, values, "model")
    arch.init_device = "cpu"  # weights are copied in right away
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    kind = hf_model.config.model_type
    if kind == "mpt":  # our parameter names are transformers' MPT names
        ours = {k: v for k, v in state.items() if not (k == "lm_head.weight" and arch.tie_word_embeddings)}
    else:
        ours = (_state_from_gpt2 if kind == "gpt2" else _state_from_llama)(arch, state)
    if not arch.attn_config.fused_qkv:
        arch.attn_config.fused_qkv = True  # imported weights come fused; keep the fused layout
    with torch.device("meta"):
        model = MPTForCausalLM(MPTConfig.from_arch(arch))
    model.to_empty(device="cpu")
    model.to(next(iter(ours.values())).dtype)
    model.load_state_dict(ours, strict=True)
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
        for mine, theirs, transposed in _GPT2_BLOCK:
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


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{path}: no config.json (not a Hugging Face model folder)")
    return json.loads(config_file.read_text())


def load_as_mpt(path: str | Path, overrides: dict | None = None, attn_overrides: dict | None = None) -> MPTForCausalLM:
    """Our MPT from a folder holding our MPT, transformers' MPT or a Llama-style model.

    ``overrides`` / ``attn_overrides`` replace run-time options (attn_impl, dropouts, init_device) of the stored
    architecture.
    """
    path = Path(path)
    overrides, attn_overrides = dict(overrides or {}), dict(attn_overrides or {})
    model_type = _read_config(path).get("model_type")
    if model_type == MPTConfig.model_type:
        config = MPTConfig.from_pretrained(path)
        for key, value in overrides.items():
            setattr(config, key, value)
        config.attn_config = {**config.attn_config, **attn_overrides}
        config.arch().validate()
        if config.init_device == "meta":
            config.init_device = "cpu"  # from_pretrained materialises the weights anyway
        return MPTForCausalLM.from_pretrained(path, config=config)
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False)
    overrides.pop("init_device", None)
    return from_transformers(hf_model, **overrides, attn_config=attn_overrides)
