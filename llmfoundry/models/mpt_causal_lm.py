"""`model.name: mpt_causal_lm`: our MPT, freshly initialised or started from a pretrained folder."""

from __future__ import annotations

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.models.hf_import import load_as_mpt
from llmfoundry.models.mpt.act_ckpt import mark_checkpointed
from llmfoundry.models.mpt.config import MPTArch, MPTModelSettings, to_dict
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.registry import models

# Options that may differ from a pretrained folder's config: they change how the network runs, not what it is.
RUNTIME_KEYS = ("init_device", "resid_pdrop", "emb_pdrop", "use_cache")
RUNTIME_ATTN_KEYS = ("attn_impl", "attn_pdrop", "attn_uses_sequence_id")


@models.register("mpt_causal_lm", config=MPTModelSettings)
def build_mpt(settings: MPTModelSettings, tokenizer) -> MPTForCausalLM:
    arch = settings.arch()  # validated with the recipe; not checked again
    if settings.loss_fn == "fused_crossentropy":
        notice_once("model.loss_fn: fused_crossentropy has no fused kernel here; training uses the plain "
                    "cross-entropy (the same values), as with torch_crossentropy")
    if settings.pretrained_model_name_or_path:
        model = load_as_mpt(
            settings.pretrained_model_name_or_path,
            overrides={k: getattr(arch, k) for k in RUNTIME_KEYS},
            attn_overrides={k: getattr(arch.attn_config, k) for k in RUNTIME_ATTN_KEYS},
        )
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
