"""MPT architecture options as typed dataclasses: the YAML schema of `model.name: mpt_causal_lm`.

The dataclasses below are the single source of truth for every key and default. They are light (no torch, no
transformers) so that checking a recipe imports neither; ``MPTConfig`` (models/mpt/config.py) stores the same
values as plain attributes (nested sections as dicts, so that ``config.json`` stays readable and llm-foundry-like)
for transformers' save_pretrained / from_pretrained / generate machinery.

Where an architecture key such as ``model.n_layers`` travels, and the one place each route validates it:

* a recipe: the schema validates ``MPTModelSettings`` (incl. ``check_settings``) -> ``settings.arch()`` ->
  ``MPTForCausalLM.from_arch(arch)``, whose ``MPTConfig.from_arch`` only copies the values out for saving;
* a folder: ``config.json`` -> ``MPTConfig(**values)``, which hands the values to the same schema validator
  (config/validate.py, against ``MPTArch``) -> ``MPTForCausalLM(config)`` takes the typed ``config.arch()``.

Names and defaults follow llm-foundry, except ``attn_impl`` whose default is ``sdpa`` so that the default model
runs on a CPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from llmfoundry.config.fields import option
from llmfoundry.models.layers.act_fn import activation_problem
from llmfoundry.models.layers.moe_keys import moe_problems
from llmfoundry.models.layers.rope_scaling import ROPE_SCALING_KEYS, ROPE_SCALING_REQUIRED
from llmfoundry.models.mpt.act_ckpt_target import target_problems
from llmfoundry.models.mpt.block_overrides import check_block_overrides
from llmfoundry.models.settings import MetricSettings

NormType = Literal["layernorm", "low_precision_layernorm", "rmsnorm", "low_precision_rmsnorm", "triton_rmsnorm"]
InitName = Literal[
    "kaiming_normal_", "kaiming_uniform_", "xavier_normal_", "xavier_uniform_", "baseline_", "small_init_",
    "neox_init_", "default_",
]  # fmt: skip


@dataclass
class AttnConfig:
    attn_type: Literal["multihead_attention", "multiquery_attention", "grouped_query_attention"] = option(
        "multihead_attention", "multihead_attention, multiquery_attention (one kv head) or grouped_query_attention"
    )
    attn_impl: Literal["torch", "sdpa", "flash", "flex"] = option(
        "sdpa", "torch (explicit reference), sdpa (torch's fused kernels; FlexAttention when training on CUDA with "
        "padding, packed documents, a window, ALiBi or soft-capping), flash (flash-attn if installed, else sdpa), "
        "flex (FlexAttention whenever there is no KV cache; training on a CPU uses sdpa)"
    )
    attn_pdrop: float = option(0.0, "dropout on attention probabilities")
    kv_n_heads: int = option(1, "key/value heads for grouped_query_attention (must divide n_heads)")
    qk_ln: bool = option(False, "normalise queries and keys (over the whole projection) before attention")
    qk_gn: bool = option(False, "normalise queries and keys per head (group norm) before attention")
    clip_qkv: float | None = option(None, "clamp the q/k/v projections to [-clip_qkv, clip_qkv]")
    softmax_scale: float | None = option(None, "attention logit scale; default 1/sqrt(head_dim)")
    fused_qkv: bool = option(True, "one Wqkv projection instead of separate q_proj/k_proj/v_proj")
    alibi: bool = option(False, "ALiBi linear attention biases")
    alibi_bias_max: int = option(8, "ALiBi: the slope of head h is 2^(-alibi_bias_max * h / n_heads)")
    rope: bool = option(False, "rotary position embeddings")
    rope_theta: float = option(10000.0, "RoPE base")
    rope_impl: Literal["dail", "hf"] = option(
        "dail", "dail (flash-attn's rotary: math in fp32, rounded once) or hf (transformers' Llama: math in the "
        "activations' dtype); both rotate halves (not interleaved) and differ only in rounding under bf16/fp16"
    )
    rope_dail_config: dict[str, Any] = option(
        {"type": "original", "pos_idx_in_fp32": True, "xpos_scale_base": 512},
        "rope_impl dail's variant: type original (xpos is refused: see the error), pos_idx_in_fp32, xpos_scale_base",
    )
    rope_hf_config: dict[str, Any] = option(
        {"type": "no_scaling", "factor": 1.0},
        "rope_impl hf's scaling, transformers' rope_scaling keys: type no_scaling | linear | dynamic (factor), yarn "
        "(factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim, "
        "truncate) or llama3 (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)",
    )
    kv_dim: int | None = option(
        None, "input width of the key/value projections (cross-attention only; must be d_model)"
    )
    reuse_kv_layer_idx: int | None = option(None, "reuse another layer's keys and values (refused: see the error)")
    nope: bool = option(
        False, "not an llm-foundry key (refused): NoPE is learned_pos_emb: false with alibi and rope off"
    )
    attn_uses_sequence_id: bool = option(False, "block-diagonal causal attention: packed documents stay separate")
    sliding_window_size: int = option(-1, "attend only to the previous N tokens (-1: unlimited)")
    attn_logit_softcapping: float | None = option(None, "cap attention logits with cap * tanh(logit / cap)")


@dataclass
class FFNConfig:
    ffn_type: Literal["mptmlp", "mptglu", "mptgeglu", "mb_moe", "mb_dmoe", "torch_dmoe"] = option(
        "mptmlp", "mptmlp (up, act, down), mptglu (gated: down(act(gate) * up); SwiGLU with ffn_act_fn silu), or a "
        "mixture of experts: mb_moe, mb_dmoe (MegaBlocks' names) and torch_dmoe, all one dropless top-k MoE here",
    )
    ffn_hidden_size: int | None = option(None, "hidden width (per expert for MoE); default expansion_ratio * d_model")
    ffn_act_fn: dict[str, Any] | None = option(
        None, "activation: {name: <any torch.nn.functional activation>, <its keyword arguments>}, e.g. {name: gelu, "
        "approximate: tanh} or {name: leaky_relu, negative_slope: 0.1}; default exact gelu (mptmlp, mptglu, "
        "torch_dmoe), gelu tanh for mb_moe/mb_dmoe (MegaBlocks' default)"
    )
    # -- mixture of experts (ffn_type mb_moe, mb_dmoe, torch_dmoe); a dense ffn_type must leave them unset ----
    moe_num_experts: int = option(
        1, "MoE: experts per layer", differs="mb_moe and mb_dmoe run this project's dropless MoE, not MegaBlocks' "
        "kernels: the same routing and outputs, except that mb_moe drops no tokens (no moe_capacity_factor)")
    moe_top_k: int = option(1, "MoE: experts each token is sent to (and weighted by its router probability)")
    moe_jitter_eps: float | None = option(None, "MoE: in training, scale the router's input by U(1 - eps, 1 + eps)")
    moe_normalize_expert_weights: float | None = option(
        None, "MoE: divide each token's top-k weights by their p-norm of this order (1: they sum to 1); none: raw "
        "router probabilities")
    moe_loss_weight: float | None = option(
        None, "MoE: weight of the load-balancing loss (1.0 for a uniform router) added to the training loss; "
        "default 0.1 for mb_moe/mb_dmoe (MegaBlocks'), 0 for torch_dmoe (llm-foundry's has no such loss)")
    moe_lbl_in_fp32: bool = option(False, "MoE: compute the load-balancing loss in float32")
    moe_weight_parallelism: bool = option(False, "MoE: MegaBlocks' weight parallelism (not implemented yet: false)")
    moe_world_size: int = option(1, "MoE: expert parallelism: consecutive ranks that split the experts among them "
                                    "(divides moe_num_experts and the world size; needs fsdp_config)")
    uniform_expert_assignment: bool = option(
        False, "MoE benchmarking: route token i's j-th choice to expert (i * top_k + j) mod experts")
    mlp_type: Literal["mlp", "glu"] = option("mlp", "MoE: each expert an MLP (w1, w2) or a GLU (w1, v1, w2)")
    mlp_impl: Literal["sparse", "grouped"] = option(
        "sparse", "MoE: MegaBlocks' kernel choice; both run the same grouped matmuls here (torch._grouped_mm "
        "where supported)")
    memory_optimized_mlp: bool = option(
        False, "MoE: MegaBlocks' activation recomputation in its MLP; accepted, no effect here (use activation "
        "checkpointing)", differs="no effect: use fsdp_config.activation_checkpointing to trade compute for memory")


@dataclass
class InitConfig:
    name: InitName = option("kaiming_normal_", "weight initialisation scheme")
    init_div_is_residual: bool | float = option(
        True, "divide residual output projections by sqrt(2 * n_layers) (true) or by this number"
    )
    emb_init_std: float | None = option(None, "std of the embedding init (overrides the scheme)")
    emb_init_uniform_lim: float | list[float] | None = option(None, "uniform embedding init in [-lim, lim] or [a, b]")
    init_std: float | None = option(None, "std for baseline_")
    init_gain: float = option(0.0, "gain (kaiming: negative slope a; xavier: gain, which must then be set)")
    fan_mode: Literal["fan_in", "fan_out"] = option("fan_in", "kaiming fan mode")
    init_nonlinearity: Literal["relu", "leaky_relu", "linear", "tanh"] = option("relu", "kaiming nonlinearity")
    verbose: int = option(0, "unused; accepted for llm-foundry compatibility")


@dataclass
class MPTArch:
    """Everything that defines an MPT network (what ``config.json`` holds)."""

    d_model: int = option(2048, "hidden size")
    n_heads: int = option(16, "attention (query) heads")
    n_layers: int = option(24, "transformer blocks")
    head_dim: int | None = option(None, "per-head width; default d_model // n_heads")
    expansion_ratio: float = option(4, "FFN width = expansion_ratio * d_model (unless ffn_hidden_size is set)")
    max_seq_len: int = option(2048, "longest sequence (size of learned positions)")
    vocab_size: int = option(50368, "embedding rows (at least the tokenizer's length)")
    resid_pdrop: float = option(0.0, "dropout on each residual branch output")
    emb_pdrop: float = option(0.0, "dropout on the embeddings")
    learned_pos_emb: bool = option(True, "learned absolute position embeddings (wpe)")
    no_bias: bool = option(False, "no bias in linear layers and norms")
    attention_bias: bool | None = option(None, "bias in the attention projections; default: not no_bias")
    norm_type: NormType = option("low_precision_layernorm", "normalisation layer")
    norm_eps: float = option(1e-5, "epsilon of the norms")
    tie_word_embeddings: bool = option(True, "the output projection is the token embedding")
    logit_scale: float | str | None = option(None, "multiply logits by this number or 'inv_sqrt_d_model'")
    final_logit_softcapping: float | None = option(None, "cap output logits with cap * tanh(logit / cap)")
    embedding_fraction: float = option(1.0, "scale the embedding gradient by this fraction (GLM-130B trick)")
    init_device: Literal["cpu", "meta", "mixed"] = option(
        "cpu", "where parameters are created; meta defers allocation until the trainer materialises shards; mixed "
               "(llm-foundry: rank 0 on the CPU, the others on meta) is meta here: each rank makes only its shards")
    use_cache: bool = option(False, "return a KV cache from forward by default")
    fc_type: str | dict[str, Any] = option("torch", "linear layer implementation: torch (or {name: torch}); te is refused")
    use_pad_tok_in_ffn: bool = option(
        True, "false: padding tokens skip the FFN; outputs at real tokens are the same, so here it changes nothing"
    )
    block_overrides: dict[str, Any] | None = option(
        None, "per-layer attention overrides: {start|repeating_pattern|end: [{name, repeat}], overrides: {name: "
        "{attn_config: {sliding_window_size: ...}}}} (llm-foundry's newer shape) or {order: [...], overrides: ...}",
    )
    attn_config: AttnConfig = option(default_factory=AttnConfig, doc="attention options")
    ffn_config: FFNConfig = option(default_factory=FFNConfig, doc="feed-forward options")
    init_config: InitConfig = option(default_factory=InitConfig, doc="initialisation options")

    # -- derived values (not config keys) -------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        kind = self.attn_config.attn_type
        if kind == "multihead_attention":
            return self.n_heads
        if kind == "multiquery_attention":
            return 1
        return self.attn_config.kv_n_heads

    @property
    def ffn_hidden(self) -> int:
        if self.ffn_config.ffn_hidden_size is not None:
            return self.ffn_config.ffn_hidden_size
        return int(self.expansion_ratio * self.d_model)

    @property
    def qkv_bias(self) -> bool:
        return (not self.no_bias) if self.attention_bias is None else self.attention_bias

    def __post_init__(self) -> None:
        # llm-foundry's rule: ALiBi and RoPE replace learned positions, so either one turns them off (released
        # MPT configs say learned_pos_emb: true next to alibi: true, and mean a model without wpe).
        a = self.attn_config
        if isinstance(a, AttnConfig) and (a.alibi or a.rope) and self.learned_pos_emb:
            scheme = "alibi" if a.alibi else "rope"
            warnings.warn(f"model.attn_config.{scheme} is on, so model.learned_pos_emb is set to false", stacklevel=3)
            self.learned_pos_emb = False
        if isinstance(a, AttnConfig) and not (a.alibi or a.rope or self.learned_pos_emb):
            warnings.warn("model: learned_pos_emb, attn_config.alibi and attn_config.rope are all off, so the model "
                          "has no positional information (NoPE), as llm-foundry also warns", stacklevel=3)

    def check_settings(self, prefix: str = "model") -> list[str]:
        """Every inconsistent key, one message each (called by config/validate.py once each key is valid alone)."""
        p, a, f = prefix, self.attn_config, self.ffn_config
        problems = []
        for key in ("d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size"):
            if getattr(self, key) <= 0:
                problems.append(f"{p}.{key}: must be positive, got {getattr(self, key)}")
        if self.head_dim is None and self.n_heads > 0 and self.d_model % self.n_heads:
            problems.append(
                f"{p}.d_model: {self.d_model} is not divisible by {p}.n_heads={self.n_heads} (or set {p}.head_dim)"
            )
        if a.attn_type == "grouped_query_attention":
            if a.kv_n_heads <= 0 or self.n_heads % a.kv_n_heads:
                problems.append(
                    f"{p}.attn_config.kv_n_heads: {a.kv_n_heads} must be a positive divisor of {p}.n_heads={self.n_heads}"
                )
        elif a.kv_n_heads != 1:
            problems.append(f"{p}.attn_config.kv_n_heads: only used with attn_type: grouped_query_attention "
                            f"(attn_type is {a.attn_type})")  # fmt: skip
        if a.alibi and a.rope:
            problems.append(f"{p}.attn_config.alibi and {p}.attn_config.rope: choose one positional scheme")
        if a.rope and self.head_size % 2:
            problems.append(f"{p}.attn_config.rope: needs an even head size, got {self.head_size}")
        if a.qk_ln and a.qk_gn:
            problems.append(f"{p}.attn_config.qk_ln and {p}.attn_config.qk_gn: choose one")
        if a.sliding_window_size == 0 or a.sliding_window_size < -1:
            problems.append(f"{p}.attn_config.sliding_window_size: -1 (off) or a positive window, got {a.sliding_window_size}")
        for key, value in (("attn_pdrop", a.attn_pdrop), ("resid_pdrop", self.resid_pdrop), ("emb_pdrop", self.emb_pdrop)):
            if not 0.0 <= value < 1.0:
                where = f"{p}.attn_config.{key}" if key == "attn_pdrop" else f"{p}.{key}"
                problems.append(f"{where}: a probability in [0, 1), got {value}")
        if a.attn_impl == "flex" and a.attn_pdrop > 0:
            problems.append(f"{p}.attn_config.attn_pdrop: FlexAttention has no attention dropout; set it to 0 or use "
                            "attn_impl: sdpa")
        if not 0.0 < self.embedding_fraction <= 1.0:
            problems.append(f"{p}.embedding_fraction: in (0, 1], got {self.embedding_fraction}")
        if isinstance(self.logit_scale, str) and self.logit_scale != "inv_sqrt_d_model":
            problems.append(f"{p}.logit_scale: a number or 'inv_sqrt_d_model', got '{self.logit_scale}'")
        if f.ffn_hidden_size is None and int(self.d_model * self.expansion_ratio) != self.d_model * self.expansion_ratio:
            problems.append(f"{p}.expansion_ratio: d_model * expansion_ratio must be a whole number, got "
                            f"{self.d_model} * {self.expansion_ratio} (or set {p}.ffn_config.ffn_hidden_size)")
        if self.init_config.name.startswith("xavier_") and self.init_config.init_gain == 0:
            problems.append(f"{p}.init_config.init_gain: {self.init_config.name} with gain 0 initialises every weight "
                            "to zero (as in llm-foundry); set init_gain, e.g. 1.0")
        problems += moe_problems(f, f"{p}.ffn_config")
        if f.ffn_act_fn is not None:
            problem = activation_problem(f.ffn_act_fn)
            if problem:
                problems.append(f"{p}.ffn_config.ffn_act_fn{problem}")
        problems += _layer_key_problems(self, p)
        if self.init_config.name == "baseline_" and self.init_config.init_std is None:
            problems.append(f"{p}.init_config.init_std: required by init_config.name=baseline_")
        return problems


def _layer_key_problems(arch: MPTArch, p: str) -> list[str]:
    """llm-foundry's keys for layer implementations, RoPE variants and per-layer overrides."""
    a, problems = arch.attn_config, []
    if a.kv_dim is not None and a.kv_dim != arch.d_model:
        problems.append(f"{p}.attn_config.kv_dim: keys/values from an input of another width exist only in "
                        f"cross-attention, which this decoder never does; remove it (got {a.kv_dim})")
    if a.nope:
        problems.append(f"{p}.attn_config.nope: llm-foundry has no such key; a model without positional encoding "
                        f"(NoPE) is {p}.learned_pos_emb: false with attn_config.alibi and attn_config.rope false")
    if a.reuse_kv_layer_idx is not None:
        problems.append(f"{p}.attn_config.reuse_kv_layer_idx: reusing another layer's keys and values is not "
                        "supported: the keys would leave their block outside its inputs and outputs, which per-block "
                        "sharding and activation checkpointing do not track (llm-foundry: flash only, per layer in "
                        "block_overrides); remove it")
    dail, hf = a.rope_dail_config, a.rope_hf_config
    extra = set(dail) - {"type", "pos_idx_in_fp32", "xpos_scale_base"}
    if extra:
        problems.append(f"{p}.attn_config.rope_dail_config.{sorted(extra)[0]}: unknown key (type, pos_idx_in_fp32, "
                        "xpos_scale_base)")
    if dail.get("type", "original") not in ("original", "xpos"):
        problems.append(f"{p}.attn_config.rope_dail_config.type: 'original' or 'xpos', got {dail.get('type')!r}")
    elif dail.get("type") == "xpos" and a.rope and a.rope_impl == "dail":
        problems.append(f"{p}.attn_config.rope_dail_config.type: xpos is not supported: flash-attn centres its "
                        "scale on the longest sequence its cache has seen, so outputs depend on earlier calls; "
                        "use type: original")
    kind = hf.get("type", "no_scaling")
    if kind not in ROPE_SCALING_KEYS:
        problems.append(f"{p}.attn_config.rope_hf_config.type: '{kind}' is not one of {', '.join(ROPE_SCALING_KEYS)}")
    else:
        for key in sorted(set(hf) - ROPE_SCALING_KEYS[kind] - {"type"}):
            problems.append(f"{p}.attn_config.rope_hf_config.{key}: not a key of type {kind} "
                            f"({', '.join(sorted(ROPE_SCALING_KEYS[kind]))})")
        for key in sorted(ROPE_SCALING_REQUIRED.get(kind, set()) - set(hf)):
            problems.append(f"{p}.attn_config.rope_hf_config.{key}: required by type {kind}")
        if kind != "no_scaling" and not (a.rope and a.rope_impl == "hf"):
            problems.append(f"{p}.attn_config.rope_hf_config: scaling applies only with rope: true and rope_impl: hf "
                            "(llm-foundry ignores it otherwise); set them or remove it")
    if arch.ffn_config.ffn_type == "mptgeglu":
        problems.append(f"{p}.ffn_config.ffn_type: 'mptgeglu' was renamed 'mptglu' in llm-foundry (#829); use "
                        "ffn_type: mptglu with ffn_act_fn: {name: gelu}")
    fc = arch.fc_type if isinstance(arch.fc_type, dict) else {"name": arch.fc_type}
    if fc.get("name") == "te":
        problems.append(f"{p}.fc_type: te (TransformerEngine's fp8 layers) is not available here: this MPT is built "
                        "from torch.nn.Linear; use fc_type: torch")
    elif fc != {"name": "torch"}:
        problems.append(f"{p}.fc_type: torch or {{name: torch}}, got {arch.fc_type!r}")
    if arch.block_overrides is not None:
        problems += check_block_overrides(arch.block_overrides, arch.n_layers, f"{p}.block_overrides")
    return problems


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


ARCH_KEYS = tuple(f.name for f in dataclasses.fields(MPTArch))


@dataclass
class MPTModelSettings(MPTArch, MetricSettings):  # MetricSettings: use_train_metrics, ...
    """The `model:` section for `name: mpt_causal_lm`: the architecture plus where to start from."""

    pretrained_model_name_or_path: str | None = option(
        None,
        "start from this folder: our MPT, transformers' MPT or a Llama-style model (its config.json then defines "
        "the architecture; attn_impl, dropouts and init_device still come from here)",
    )
    loss_fn: Literal["fused_crossentropy", "torch_crossentropy"] | None = option(
        None, "llm-foundry's training loss choice: torch_crossentropy = the plain cross-entropy; fused_crossentropy "
        "(llm-foundry's default, a flash-attn kernel) has no fused kernel here and computes the same plain loss, "
        "with a notice (none = the plain loss)",
        differs="fused_crossentropy has no fused kernel here: the plain cross-entropy (same values) is used",
    )

    activation_checkpointing_target: str | list[str] | dict[str, Any] | None = option(
        None, "with fsdp_config.activation_checkpointing: which modules to recompute, as in llm-foundry: null = "
        "every MPTBlock; a module name (mptblock, grouped_query_attention, mptmlp, mptglu, rmsnorm, ...) or a "
        "mapping name -> blocks (n, [ids], 'first-n, last-k, middle-m, range-i-j')",
    )

    def check_settings(self, prefix: str = "model") -> list[str]:
        problems = super().check_settings(prefix)
        return problems + target_problems(self.activation_checkpointing_target, self.n_layers, prefix)

    def arch(self) -> MPTArch:
        """The architecture part of these settings (the recipe schema has validated it with them)."""
        return MPTArch(**{key: getattr(self, key) for key in ARCH_KEYS})
