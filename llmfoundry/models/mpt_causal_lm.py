"""`model.name: mpt_causal_lm`: our MPT, freshly initialised or started from a pretrained folder.

With ``init_device: meta`` a folder whose tensor names are our MPT's (our own MPT, transformers' MPT) is not read
here: the model is built on the meta device and train/parallel.py reads each rank's shards from the folder's
safetensors after sharding (models/pretrained_weights.py). Llama and GPT-2 folders are converted tensor by tensor
(fused, transposed) as they are read, so every rank reads them whole (llmfoundry.models.hf_import).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.models.hf_import import arch_from_transformers, load_as_mpt
from llmfoundry.models.mpt.act_ckpt import mark_checkpointed
from llmfoundry.models.mpt.arch import MPTArch, MPTModelSettings, to_dict
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.models.pretrained_weights import PretrainedWeights, safetensors_files

# Options that may differ from a pretrained folder's config: they change how the network runs, not what it is.
RUNTIME_KEYS = ("init_device", "resid_pdrop", "emb_pdrop", "use_cache")
RUNTIME_ATTN_KEYS = ("attn_impl", "attn_pdrop", "attn_uses_sequence_id")


def build_mpt(settings: MPTModelSettings, tokenizer) -> MPTForCausalLM:
    """The `mpt_causal_lm` builder (declared in models/catalog.py)."""
    arch = settings.arch()  # validated with the recipe; not checked again
    if settings.loss_fn == "fused_crossentropy":
        notice_once("model.loss_fn: fused_crossentropy has no fused kernel here; training uses the plain "
                    "cross-entropy (the same values), as with torch_crossentropy")
    if arch.ffn_config.ffn_type == "mb_moe":
        notice_once("model.ffn_config.ffn_type: mb_moe is dropless here; llm-foundry's (MegaBlocks') mb_moe drops a "
                    "token's choice once its expert holds moe_capacity_factor (1) x an even share, so an unbalanced "
                    "router trains differently (mb_dmoe is dropless in both)")
    if settings.pretrained_model_name_or_path:
        path = settings.pretrained_model_name_or_path
        overrides = {k: getattr(arch, k) for k in RUNTIME_KEYS}
        attn_overrides = {k: getattr(arch.attn_config, k) for k in RUNTIME_ATTN_KEYS}
        model = meta_from_folder(path, overrides, attn_overrides) if arch.init_device in ("meta", "mixed") else None
        if model is None:
            if arch.init_device in ("meta", "mixed"):
                notice_once("model.init_device: meta reads a Llama or GPT-2 folder whole on every rank (its "
                            "tensors are converted to MPT's as they are read)")
            model = load_as_mpt(path, overrides=overrides, attn_overrides=attn_overrides)
        conflicts = conflicts_with_pretrained(arch, model.arch)
        if conflicts:
            raise ConfigError.many(conflicts)
    else:
        model = MPTForCausalLM.from_arch(arch)
    if settings.activation_checkpointing_target is not None:  # null: every block (the trainer's default)
        mark_checkpointed(model.blocks(), settings.activation_checkpointing_target, model.arch.attn_config.attn_type)
    vocab = model.arch.vocab_size
    if tokenizer is not None and len(tokenizer) > vocab:
        raise ConfigError(
            f"model.vocab_size: {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens "
            f"(set model.vocab_size to at least {len(tokenizer)}; a multiple of 64 is fastest)"
        )
    return model


def meta_from_folder(path: str, overrides: dict, attn_overrides: dict) -> MPTForCausalLM | None:
    """Our MPT of the folder's architecture on the meta device, with where to read its weights attached; None for
    a folder whose tensors are not stored under our names."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return None  # load_as_mpt says what is wrong with it
    values = json.loads((folder / "config.json").read_text())
    if values.get("model_type") == MPTConfig.model_type:
        values.update(overrides)  # run-time options replace the stored ones, as in load_as_mpt
        values["attn_config"] = {**(values.get("attn_config") or {}), **attn_overrides}
        arch = MPTConfig(**values).arch()
    elif values.get("model_type") == "mpt":  # transformers' MPT: our names, its Wqkv fused
        arch = arch_from_transformers(AutoConfig.from_pretrained(folder), **overrides,
                                      attn_config={**attn_overrides, "fused_qkv": True})
    else:
        return None
    model = MPTForCausalLM.from_arch(arch)
    files = safetensors_files(folder, "model.pretrained_model_name_or_path")
    model.pretrained_weights = PretrainedWeights([(files, lambda name: [name])], "model.pretrained_model_name_or_path")
    return model


def conflicts_with_pretrained(given: MPTArch, loaded: MPTArch) -> list[str]:
    """Architecture keys the recipe sets (to a non-default value) that the pretrained folder contradicts: the
    folder's config.json defines the network, so such a key would otherwise be silently ignored."""
    default, given_values, loaded_values = to_dict(MPTArch()), to_dict(given), to_dict(loaded)
    problems = []

    def compare(path: str, value, default_value, loaded_value) -> None:
        if value != default_value and value != loaded_value:
            problems.append(f"model.{path}: {value!r} differs from the pretrained folder's {loaded_value!r} (its "
                            "config.json defines the architecture; remove the key)")

    for key, value in given_values.items():
        if key in RUNTIME_KEYS or key == "init_config":  # init is irrelevant: the weights are loaded
            continue
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                if not (key == "attn_config" and sub in RUNTIME_ATTN_KEYS):
                    compare(f"{key}.{sub}", sub_value, default[key].get(sub), loaded_values[key].get(sub))
        else:
            compare(key, value, default[key], loaded_values[key])
    return problems
