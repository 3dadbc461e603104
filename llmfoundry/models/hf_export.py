"""Export our MPT to transformers' own classes (what ``llmfoundry convert`` writes).

Export picks the transformers class that can express the architecture:

* ``MptForCausalLM`` for ALiBi + multi-head attention + exact-GELU MLP (4x) + bias-free LayerNorm;
* ``LlamaForCausalLM`` for RoPE + RMSNorm + gated MLP (SwiGLU or another activation), with any kv_n_heads;
* ``GPT2LMHeadModel`` for learned positions + multi-head attention + LayerNorm + MLP (llm-foundry's default MPT
  architecture, with or without biases: missing biases are exported as zeros);
* ``DbrxForCausalLM`` for a mixture-of-experts MPT with GLU experts (ffn_type mb_dmoe or torch_dmoe: mb_moe's are
  MLPs), RoPE, bias-free LayerNorm (eps 1e-5) and no biases, with any kv_n_heads and clip_qkv. DBRX always has an
  lm_head of its own, so a tied MPT exports its embedding twice (the same function).

A ``logit_scale`` (llm-foundry's, e.g. 0.5 or inv_sqrt_d_model) is folded into an untied ``lm_head`` of the GPT-2
and Llama exports: scale * (h @ W.T) is h @ (scale * W).T, so the exported logits are the same.

Anything else is a ConfigError that names each option that stands in the way, because a silently different
exported model is worse than none. Our parameter names already match transformers' MPT, so the MPT mapping is
the identity; the Llama one splits the fused Wqkv into q/k/v projections; the DBRX one reshapes the experts'
stacked (experts, ffn_hidden_size, d_model) weights into DBRX's (experts * ffn_hidden_size, d_model) matrices.
Two DBRX differences only show in training inside transformers, never in outputs: its router jitter
(moe_jitter_eps) also scales the experts' input, and its load-balancing loss is Switch Transformer's, not
MegaBlocks'. The way back (a transformers folder
-> our MPT) is llmfoundry.models.hf_import.

``llmfoundry convert`` (llmfoundry.commands.convert) runs ``export_hf`` on a loaded model.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from transformers import (
    DbrxConfig,
    DbrxForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MptConfig,
    MptForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.precision import DTYPES
from llmfoundry.models.layers.act_fn import DEFAULT_ACT_FN
from llmfoundry.models.layers.moe_keys import MEGABLOCKS_ACT_FN, MEGABLOCKS_TYPES, is_moe, loss_weight
from llmfoundry.models.mpt.arch import MPTArch
from llmfoundry.models.mpt.model import MPTForCausalLM

# activation spec (ffn_config.ffn_act_fn) -> transformers' ACT2FN names
_ACT_TO_HF = {("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_pytorch_tanh", ("gelu_tanh", "none"): "gelu_pytorch_tanh",
              ("silu", "none"): "silu", ("relu", "none"): "relu"}  # fmt: skip


def _act(arch: MPTArch) -> tuple[str, str]:
    f = arch.ffn_config  # llm-foundry's defaults: exact GELU, except MegaBlocks' tanh GELU for mb_moe / mb_dmoe
    spec = f.ffn_act_fn or (MEGABLOCKS_ACT_FN if f.ffn_type in MEGABLOCKS_TYPES else DEFAULT_ACT_FN)
    return spec.get("name"), spec.get("approximate", "none")


# -- what each transformers class can express ----------------------------------------------------------------

def _common_problems(arch: MPTArch, target: str, *, folds_logit_scale: bool = False) -> list[str]:
    """``folds_logit_scale``: the target can have an untied lm_head, which takes the scale (_output_head)."""
    a, p = arch.attn_config, "model"
    problems = []
    checks = [
        (a.qk_ln, "attn_config.qk_ln", "true"),
        (a.qk_gn, "attn_config.qk_gn", "true"),
        (a.sliding_window_size != -1, "attn_config.sliding_window_size", a.sliding_window_size),
        (a.attn_logit_softcapping is not None, "attn_config.attn_logit_softcapping", a.attn_logit_softcapping),
        (arch.final_logit_softcapping is not None, "final_logit_softcapping", arch.final_logit_softcapping),
        (arch.logit_scale is not None and not folds_logit_scale, "logit_scale", arch.logit_scale),
        (arch.block_overrides is not None, "block_overrides", "(per-layer windows)"),
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


def _rope_scaling(arch: MPTArch) -> dict | None:
    """rope_hf_config as transformers' rope_parameters (None: no scaling)."""
    a = arch.attn_config
    kind = a.rope_hf_config.get("type", "no_scaling")
    if not (a.rope and a.rope_impl == "hf") or kind == "no_scaling":
        return None
    return {**{k: v for k, v in a.rope_hf_config.items() if k != "type"}, "rope_type": kind}


def _rope_scaling_problems(arch: MPTArch, t: str) -> list[str]:
    scaling = _rope_scaling(arch)
    return [f"model.attn_config.rope_hf_config: {t} cannot express RoPE scaling {scaling}"] if scaling else []


def mpt_export_problems(arch: MPTArch) -> list[str]:
    a, t = arch.attn_config, "transformers' MptForCausalLM"
    problems = _common_problems(arch, t) + _multihead_problems(arch, t) + _norm_problems(arch, t, "layernorm")
    problems += _rope_scaling_problems(arch, t)
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
    problems = _common_problems(arch, t, folds_logit_scale=True) + _plain_attention_problems(arch, t)
    if arch.learned_pos_emb:
        problems.append(f"model.learned_pos_emb: {t} has no learned position embeddings")
    return problems + _ffn_problems(arch, t, "mptglu", "a gated MLP") + _norm_problems(arch, t, "rmsnorm")


def gpt2_export_problems(arch: MPTArch) -> list[str]:
    t = "transformers' GPT2LMHeadModel"
    return (_common_problems(arch, t, folds_logit_scale=True) + _multihead_problems(arch, t)
            + _plain_attention_problems(arch, t)
            + _rope_scaling_problems(arch, t)
            + _ffn_problems(arch, t, "mptmlp", "a plain MLP") + _norm_problems(arch, t, "layernorm"))


DBRX_EPS = 1e-5  # DBRX's LayerNorms are nn.LayerNorm(d_model, bias=False): eps is torch's default, not configurable


def dbrx_export_problems(arch: MPTArch) -> list[str]:
    a, f, t = arch.attn_config, arch.ffn_config, "transformers' DbrxForCausalLM"
    problems = _common_problems(arch, t) + _norm_problems(arch, t, "layernorm")
    if not is_moe(f.ffn_type):
        problems.append(f"model.ffn_config.ffn_type: {t} has mixture-of-experts FFNs (use mb_dmoe), got {f.ffn_type}")
    if f.mlp_type != "glu":
        problems.append(f"model.ffn_config.mlp_type: {t}'s experts are GLUs (set mlp_type: glu), got {f.mlp_type}")
    if _act(arch) not in _ACT_TO_HF:
        problems.append(f"model.ffn_config.ffn_act_fn: {t} has no activation {_act(arch)}")
    if f.uniform_expert_assignment:
        problems.append(f"model.ffn_config.uniform_expert_assignment: {t} always routes by its router (set false)")
    if not a.rope:
        problems.append(f"model.attn_config.rope: {t} always uses RoPE (set rope: true and alibi: false)")
    if arch.learned_pos_emb:
        problems.append(f"model.learned_pos_emb: {t} has no learned position embeddings (set learned_pos_emb: false)")
    if arch.head_dim is not None and arch.head_dim * arch.n_heads != arch.d_model:
        problems.append(f"model.head_dim: {t} needs head_dim = d_model / n_heads (remove head_dim)")
    if a.softmax_scale is not None and not math.isclose(a.softmax_scale, arch.head_size**-0.5):
        problems.append(f"model.attn_config.softmax_scale: {t} always scales by 1/sqrt(head_dim) (remove it)")
    if not arch.no_bias:
        problems.append(f"model.no_bias: {t} has no biases (set no_bias: true)")
    elif arch.qkv_bias:
        problems.append(f"model.attention_bias: {t} has no attention biases (set attention_bias: false)")
    if not math.isclose(arch.norm_eps, DBRX_EPS):
        problems.append(f"model.norm_eps: {t}'s LayerNorms use eps {DBRX_EPS}, got {arch.norm_eps}")
    return problems


# our MPT block's layers <-> GPT-2's, and whether the weight is stored transposed (GPT-2's Conv1D is x @ W)
GPT2_BLOCK_LAYERS = (("norm_1", "ln_1", False), ("attn.Wqkv", "attn.c_attn", True), ("attn.out_proj", "attn.c_proj", True),
               ("norm_2", "ln_2", False), ("ffn.up_proj", "mlp.c_fc", True), ("ffn.down_proj", "mlp.c_proj", True))

# our MPT block's tensors <-> DBRX's (both under transformer.blocks.{i}.): DBRX nests the norms and attention in
# norm_attn_norm; the router keeps its name, and so do the experts', which are reshaped (see the module doc)
DBRX_BLOCK_TENSORS = tuple((name, f"norm_attn_norm.{name}") for name in (
    "norm_1.weight", "attn.Wqkv.weight", "attn.out_proj.weight", "norm_2.weight")) + (("ffn.router.layer.weight",) * 2,)
DBRX_EXPERT_TENSORS = ("ffn.experts.mlp.w1", "ffn.experts.mlp.v1", "ffn.experts.mlp.w2")  # the same name in both


# -- export -------------------------------------------------------------------------------------------------

def to_transformers(model: MPTForCausalLM, *, eos_token_id=None, bos_token_id=None, pad_token_id=None) -> nn.Module:
    """A transformers-native model (MptForCausalLM, LlamaForCausalLM, GPT2LMHeadModel or, for a mixture of
    experts, DbrxForCausalLM) with the same weights and outputs."""
    arch = model.arch
    tokens = dict(eos_token_id=eos_token_id, bos_token_id=bos_token_id, pad_token_id=pad_token_id)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if is_moe(arch.ffn_config.ffn_type):  # the only transformers class here with MoE FFNs
        problems = dbrx_export_problems(arch)
        if problems:
            raise ConfigError.many(problems)
        hf_model = _dbrx_from_state(arch, state, tokens)
    elif arch.learned_pos_emb:
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


def _tied_head(arch: MPTArch) -> bool:
    """Whether the export ties its lm_head to the embeddings: as the model does, unless a logit_scale must go into
    a head of its own."""
    return arch.tie_word_embeddings and arch.logit_scale is None


def _output_head(arch: MPTArch, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"lm_head.weight": ...}`` for an untied export (the logit_scale folded in), or nothing for a tied one."""
    if _tied_head(arch):
        return {}
    head = state.get("lm_head.weight", state["transformer.wte.weight"])
    if arch.logit_scale is None:
        return {"lm_head.weight": head}
    scale = 1 / math.sqrt(arch.d_model) if arch.logit_scale == "inv_sqrt_d_model" else float(arch.logit_scale)
    return {"lm_head.weight": head * scale}


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
    config = LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.d_model, intermediate_size=arch.ffn_hidden,
        num_hidden_layers=arch.n_layers, num_attention_heads=arch.n_heads, num_key_value_heads=arch.kv_heads,
        head_dim=arch.head_size, hidden_act=_ACT_TO_HF[_act(arch)], max_position_embeddings=arch.max_seq_len,
        rms_norm_eps=arch.norm_eps, tie_word_embeddings=_tied_head(arch), attention_bias=arch.qkv_bias,
        mlp_bias=not arch.no_bias,
        rope_parameters={"rope_type": "default", **(_rope_scaling(arch) or {}),
                         "rope_theta": float(arch.attn_config.rope_theta)},
        use_cache=True, **tokens,
    )  # fmt: skip
    out = {"model.embed_tokens.weight": state["transformer.wte.weight"], "model.norm.weight": state["transformer.norm_f.weight"],
           **_output_head(arch, state)}
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
    config = GPT2Config(
        vocab_size=arch.vocab_size, n_positions=arch.max_seq_len, n_embd=arch.d_model, n_layer=arch.n_layers,
        n_head=arch.n_heads, n_inner=arch.ffn_hidden, activation_function=_ACT_TO_HF[_act(arch)],
        layer_norm_epsilon=arch.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=_tied_head(arch), use_cache=True, **tokens,
    )  # fmt: skip
    zeros = lambda n: torch.zeros(n, dtype=state["transformer.wte.weight"].dtype)  # noqa: E731
    out = {"transformer.wte.weight": state["transformer.wte.weight"],
           "transformer.wpe.weight": state["transformer.wpe.weight"],
           "transformer.ln_f.weight": state["transformer.norm_f.weight"],
           "transformer.ln_f.bias": state.get("transformer.norm_f.bias", zeros(arch.d_model)),
           **_output_head(arch, state)}  # fmt: skip
    for i in range(arch.n_layers):
        src, dst = f"transformer.blocks.{i}.", f"transformer.h.{i}."
        layers = dict(state)
        for kind in ("weight", "bias"):  # one fused qkv projection, as GPT-2's c_attn
            q, k, v = _unfused_qkv(arch, state, i, kind)
            if q is not None:
                layers[src + f"attn.Wqkv.{kind}"] = torch.cat([q, k, v])
        for ours, theirs, transposed in GPT2_BLOCK_LAYERS:
            weight = layers[src + f"{ours}.weight"]
            out[dst + f"{theirs}.weight"] = weight.t().contiguous() if transposed else weight
            out[dst + f"{theirs}.bias"] = layers.get(src + f"{ours}.bias", zeros(weight.shape[0]))
    return _load_into(GPT2LMHeadModel, config, out)


# transformers' DbrxAttention (5.x) clamps q/k/v with clip_qkv as both bounds and fails when it is None (torch.clamp
# with neither bound): a model without clipping is written with float16's largest value, a bound every dtype the
# model may run in can hold (float32's max overflows bf16/fp16 clamps), and read back as None (hf_import).
DBRX_NO_CLIP = float(torch.finfo(torch.float16).max)


def _dbrx_from_state(arch: MPTArch, state: dict, tokens: dict) -> nn.Module:
    a, f = arch.attn_config, arch.ffn_config
    theta = float(a.rope_theta)
    config = DbrxConfig(
        d_model=arch.d_model, n_heads=arch.n_heads, n_layers=arch.n_layers, max_seq_len=arch.max_seq_len,
        vocab_size=arch.vocab_size, resid_pdrop=float(arch.resid_pdrop), emb_pdrop=float(arch.emb_pdrop),
        # DBRX's own code, transformers 4.x and DbrxAttention read attn_config.rope_theta; 5.x's rotary tables
        # read rope_parameters: both are written
        attn_config={"attn_pdrop": float(a.attn_pdrop), "kv_n_heads": arch.kv_heads, "rope_theta": theta,
                     "clip_qkv": DBRX_NO_CLIP if a.clip_qkv is None else a.clip_qkv},
        ffn_config={"ffn_act_fn": {"name": _ACT_TO_HF[_act(arch)]}, "ffn_hidden_size": arch.ffn_hidden,
                    "moe_num_experts": f.moe_num_experts, "moe_top_k": f.moe_top_k,
                    "moe_jitter_eps": f.moe_jitter_eps, "moe_loss_weight": float(loss_weight(f)),
                    "moe_normalize_expert_weights": None if f.moe_normalize_expert_weights is None
                    else float(f.moe_normalize_expert_weights)},
        rope_parameters={"rope_type": "default", **(_rope_scaling(arch) or {}), "rope_theta": theta},
        tie_word_embeddings=False, use_cache=True, **tokens,
    )  # fmt: skip
    wte = state["transformer.wte.weight"]
    out = {"transformer.wte.weight": wte, "transformer.norm_f.weight": state["transformer.norm_f.weight"],
           "lm_head.weight": state.get("lm_head.weight", wte)}  # a tied head is written as a copy
    for i in range(arch.n_layers):
        block = f"transformer.blocks.{i}."  # the same prefix in both
        out[block + "norm_attn_norm.attn.Wqkv.weight"] = torch.cat(_unfused_qkv(arch, state, i, "weight"))
        for ours, theirs in DBRX_BLOCK_TENSORS:
            if ours != "attn.Wqkv.weight":
                out[block + theirs] = state[block + ours]
        for name in DBRX_EXPERT_TENSORS:  # (experts, hidden, d_model) -> (experts * hidden, d_model)
            out[block + name] = state[block + name].reshape(-1, arch.d_model)
    return _load_into(DbrxForCausalLM, config, out)


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
            kind = getattr(module, "rope_type", "default")
            init = module.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
            inv_freq, module.attention_scaling = init(module.config)
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
