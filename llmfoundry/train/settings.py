"""Config sections of the trainer's parallelism and checkpoint upload (llm-foundry's key names).

The code that applies these settings lives in parallel.py (FSDP2/DDP/compile) and checkpointer.py / uploads.py
(staging and background upload to an s3:// save_folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from llmfoundry.config.fields import option
from llmfoundry.core.dtype_names import DTYPE_NAMES
from llmfoundry.core.errors import did_you_mean

_NO_FSDP2 = "accepted for llm-foundry recipes; no FSDP2 meaning: ignored, with a notice when set to another value"
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")


@dataclass(kw_only=True)
class FSDPConfig:
    """``fsdp_config``: FSDP2 ``fully_shard`` on every block (``model.blocks()``), then on the root module."""

    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD"] = option(
        "FULL_SHARD",
        "FULL_SHARD = shard params, grads, optimizer state, re-gather for backward; SHARD_GRAD_OP = keep params "
        "gathered between forward and backward (reshard_after_forward=False); HYBRID_SHARD = shard inside a "
        "group of data_parallel_shard_degree ranks (default: one node), replicate across groups (2-D mesh); "
        "_HYBRID_SHARD_ZERO2 = HYBRID_SHARD without resharding after forward; NO_SHARD = replicate everywhere "
        "(a 2-D mesh with shard size 1)",
    )
    mixed_precision: Literal["PURE", "DEFAULT", "FULL"] | dict[str, str] = option(
        "DEFAULT",
        "PURE = params and gradient reduction in the precision's low dtype; DEFAULT = params in the low dtype, "
        "reduction in fp32; FULL = fp32 throughout; or a mapping {param_dtype, reduce_dtype, buffer_dtype} of "
        "fp32/bf16/fp16 (the low dtype comes from `precision`: bf16 for amp_bf16/bf16, fp16 for amp_fp16); "
        "buffer_dtype has no FSDP2 meaning (buffers keep their dtype) and is accepted for llm-foundry recipes",
    )
    activation_checkpointing: bool = option(
        False, "recompute activations in backward: each block's, or (MPT) the modules model.activation_checkpointing_target selects"
    )
    activation_checkpointing_reentrant: bool = option(
        False, "use the reentrant torch.utils.checkpoint implementation (default: non-reentrant)"
    )
    activation_checkpointing_mode: str = option(
        "full", "with activation_checkpointing: full = recompute each checkpointed module's whole forward; "
        "selective_op = torchtitan's per-op policy (keep matmul and attention outputs except every second matmul, "
        "recompute the rest); selective_layer_N = checkpoint every Nth module in full, keep the others' activations",
        differs="an llmfoundry extension (llm-foundry checkpoints in full)",
    )
    activation_cpu_offload: bool = option(False, "keep saved activations in (pinned) CPU memory between forward and backward")
    cpu_offload: bool = option(False, "keep sharded parameters, gradients and optimizer state on the CPU (FSDP2 CPUOffloadPolicy)")
    state_dict_type: Literal["sharded", "full", "local"] = option(
        "sharded",
        "sharded = each rank writes its shards (DCP; reshards on load); full = additionally write the gathered "
        "weights as model_full.pt next to the shards (rank 0), loadable without torch.distributed; local = "
        "Composer's per-rank local shards: saved as sharded (which also reshards on load), with a notice",
        differs="checkpoints are sharded DCP folders; 'local' is saved as 'sharded' (reshards on load), 'full' adds "
        "model_full.pt; Composer's default is 'full'",
    )
    reshard_after_forward: bool | None = option(
        None, "FSDP2's own switch; overrides the choice implied by sharding_strategy when set"
    )
    data_parallel_shard_degree: int = option(
        -1, "ranks per shard group for HYBRID_SHARD (-1 = LOCAL_WORLD_SIZE, i.e. one node)"
    )
    data_parallel_replicate_degree: int = option(
        -1, "number of replica groups for HYBRID_SHARD (-1 = world size / shard degree)"
    )
    # --- llm-foundry's FSDP1 keys: mapped onto FSDP2 where they have a meaning (see parallel.py) ---
    auto_wrap: bool = option(True, "shard each block, then the root; false = only the root (one FSDP unit)")
    forward_prefetch: bool = option(
        False, "issue the next blocks' all-gathers explicitly in forward (FSDP2 set_modules_to_forward_prefetch)"
    )
    forward_prefetch_limit: int = option(1, "blocks ahead that forward_prefetch gathers")
    backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST", "NONE"] = option(
        "BACKWARD_PRE", "BACKWARD_PRE = gather the previous block before the current one's backward (FSDP2's own "
        "behaviour); BACKWARD_POST and NONE have no FSDP2 counterpart: accepted with a notice",
    )
    backward_prefetch_limit: int = option(
        1, "blocks BACKWARD_PRE gathers ahead in backward (> 1: FSDP2 set_modules_to_backward_prefetch)"
    )
    sync_module_states: bool = option(
        False, "broadcast rank 0's weights to every rank before sharding (a meta-device model is built from the "
        "seed on every rank, identical by construction)",
    )
    # --- FSDP1 knobs with no FSDP2 meaning: accepted, with a one-line notice when set to another value ---
    limit_all_gathers: bool = option(True, f"{_NO_FSDP2} (FSDP2 always limits in-flight all-gathers)", differs=_NO_FSDP2)
    use_orig_params: bool = option(True, f"{_NO_FSDP2} (FSDP2 always exposes the original parameters)", differs=_NO_FSDP2)
    load_monolith_rank0_only: bool = option(False, f"{_NO_FSDP2} (every rank reads what it needs)", differs=_NO_FSDP2)
    verbose: bool = option(False, _NO_FSDP2, differs=_NO_FSDP2)
    activation_checkpointing_fn: str | None = option(
        None, f"{_NO_FSDP2}; no effect in llm-foundry either (choose modules with model.activation_checkpointing_target)"
    )

    def check_settings(self, path: str) -> list[str]:
        """A mixed_precision mapping names known keys and dtypes, so that parallel.py can use it as it is; the
        activation checkpointing mode is one parallel.py knows, and asked for only with checkpointing on."""
        prefix = f"{path}." if path else ""
        problems = []
        try:
            kind, _ = parse_checkpointing_mode(self.activation_checkpointing_mode)
        except ValueError as error:
            problems.append(f"{prefix}activation_checkpointing_mode: {error}")
        else:
            if kind != "full" and not self.activation_checkpointing:
                problems.append(f"{prefix}activation_checkpointing_mode: {self.activation_checkpointing_mode} "
                                "applies only with activation_checkpointing: true (set it, or remove the mode)")
        if not isinstance(self.mixed_precision, dict):
            return problems
        where = f"{prefix}mixed_precision"
        for key, name in self.mixed_precision.items():
            if key not in MIXED_PRECISION_KEYS:
                problems.append(f"{where}.{key}: unknown key (use {', '.join(MIXED_PRECISION_KEYS)})")
            elif name not in DTYPE_NAMES:
                problems.append(f"{where}.{key}: '{name}' is not a dtype (use one of {', '.join(DTYPE_NAMES)})")
        return problems


CHECKPOINTING_MODES = ("full", "selective_op", "selective_layer_N")


def parse_checkpointing_mode(mode: str) -> tuple[str, int]:
    """``fsdp_config.activation_checkpointing_mode`` as (full | selective_op | selective_layer, N); N is 1 but for
    selective_layer_N. Raises ValueError with the fix (the closest mode) in one line."""
    if mode in ("full", "selective_op"):
        return mode, 1
    kind, _, every = str(mode).rpartition("_")
    if kind == "selective_layer" and every.isdigit() and int(every) >= 1:
        return kind, int(every)
    if kind == "selective_layer":
        raise ValueError(f"'{mode}': N must be a whole number of at least 1 (e.g. selective_layer_2)")
    raise ValueError(f"'{mode}' is not a mode (use one of {', '.join(CHECKPOINTING_MODES)})"
                     f"{did_you_mean(str(mode), ('full', 'selective_op', 'selective_layer_2'))}")


@dataclass(kw_only=True)
class CompileConfig:
    """``compile_config``: ``torch.compile`` of each block, or of the whole model (``scope: model``);
    ``compile_config: {}`` = the defaults. The other keys are torch.compile's arguments, as in llm-foundry."""

    scope: Literal["block", "model"] = option(
        "block", "block = compile each transformer block on its own (short compiles, one graph reused by every "
        "block); model = compile the whole model at once (embeddings, blocks and output head in as few graphs "
        "as it can, as Composer's compile_config does)",
        differs="llm-foundry (Composer) compiles the whole model; here each block unless scope: model",
    )

    backend: str = option("inductor", "torch.compile backend (inductor; eager/aot_eager to debug)")
    mode: str | None = option(None, "torch.compile mode: default, reduce-overhead, max-autotune, ...")
    fullgraph: bool = option(False, "fail instead of falling back on graph breaks")
    dynamic: bool | None = option(None, "dynamic shapes (none = let torch decide)")
    options: dict[str, Any] = option(default_factory=dict, doc="backend options passed to torch.compile")


@dataclass(kw_only=True)
class CheckpointUploadConfig:
    """How checkpoints reach an ``s3://`` save_folder: written to a local staging folder, uploaded in the background."""

    staging_folder: str | None = option(
        None, "local folder where checkpoints are written before upload (default: a folder under the system temp dir)"
    )
    timeout_s: float = option(3600.0, "keep retrying a failed upload for this long before giving the checkpoint up")
    initial_backoff_s: float = option(0.5, "first wait before retrying a failed request (doubles each retry)")
    max_backoff_s: float = option(8.0, "longest wait between retries")
    wait_at_end_s: float = option(3600.0, "at the end of training, wait this long for pending uploads")


@dataclass(kw_only=True)
class TPConfig:
    """``tp_config``: tensor parallelism of the MPT blocks (torch.distributed.tensor.parallel, see
    models/mpt/tensor_parallel.py). The ranks of one TP group train on the same microbatch; data parallelism (FSDP2,
    ``fsdp_config``) runs across the groups on a 2-D (dp, tp) mesh, dp = world size / tensor_parallel_degree."""

    strategy: Literal["ffn", "block"] = option(
        "ffn",
        "ffn = llm-foundry's plan: each block's FFN up_proj column-parallel, down_proj row-parallel; block = also "
        "q/k/v projections column-parallel by head, out_proj row-parallel, norms sequence-parallel",
        differs="the TP ranks of a group train on the same microbatch (llm-foundry's ffn plan gathers a batch "
        "split across them); block needs attn_config.fused_qkv: false",
    )
    tensor_parallel_degree: int = option(1, "ranks per TP group (divides the world size and the FFN width; block: "
                                            "also the query and key/value heads)")
    layer_plan: dict[str, Any] | None = option(
        None, "Composer's explicit module -> ParallelStyle plan: not supported (refused); use strategy",
        differs="refused: plans are built by strategy",
    )

    def check_settings(self, path: str) -> list[str]:
        where = f"{path}." if path else ""
        problems = []
        if self.tensor_parallel_degree < 1:
            problems.append(f"{where}tensor_parallel_degree: must be at least 1, got {self.tensor_parallel_degree}")
        if self.layer_plan is not None:
            problems.append(f"{where}layer_plan: explicit plans are not supported; use {where}strategy: ffn | block")
        return problems
