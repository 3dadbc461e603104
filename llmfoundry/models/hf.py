"""`model.name: hf_causal_lm`: any transformers AutoModelForCausalLM behind the trainer's model interface.

The wrapper adds what the trainer relies on (the ``CausalLM`` protocol of models/interface.py) and optionally
wraps the model in LoRA adapters through the ``peft`` library. Packed documents (``sequence_id``) become
position ids that restart at each document; transformers reads such position ids as packed sequences and keeps
the documents from attending to each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

from llmfoundry.config.fields import option
from llmfoundry.core.errors import ConfigError, did_you_mean, first_line
from llmfoundry.core.notices import notice_once
from llmfoundry.models.layers.positional import segment_positions
from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM  # importing it lets the Auto classes open our MPT
from llmfoundry.registry import models


@dataclass
class HFModelSettings:
    pretrained_model_name_or_path: str = option(doc="a local folder (or a hub id when online)")
    pretrained: bool = option(True, "load the pretrained weights (false: random weights from the config)")
    config_overrides: dict[str, Any] = option({}, "values that replace keys of the model's config.json")
    trust_remote_code: bool = option(False, "allow running modelling code shipped inside the folder")
    use_flash_attention_2: bool = option(False, "shorthand for attn_implementation: flash_attention_2")
    attn_implementation: str | None = option(None, "transformers attention backend: eager, sdpa, flash_attention_2")
    peft_config: dict[str, Any] | None = option(
        None, "LoRA adapters via peft: {peft_type: LORA, r: 8, lora_alpha: 16, target_modules: [...], ...}"
    )
    init_device: Literal["cpu", "mixed", "meta"] = option(
        "cpu", "where the weights are first created (llm-foundry: mixed = rank 0 reads them, the others wait on the "
        "meta device for FSDP's sync_module_states); here every rank reads them on the CPU",
        differs="mixed/meta: every rank reads the pretrained weights itself (host memory: one copy per rank)",
    )
    use_auth_token: str | bool | None = option(
        None, "Hugging Face hub token (or true: the saved login) for gated or private hub models", secret=True
    )
    load_in_8bit: bool = option(False, "8-bit weights through bitsandbytes (needs a CUDA GPU and bitsandbytes)")
    pretrained_lora_id_or_path: str | None = option(
        None, "a trained LoRA adapter to continue", unsupported="continuing a LoRA adapter (pretrained_lora_id_or_path)"
    )


class HFCausalLM(nn.Module):
    """A transformers causal LM (optionally with peft adapters) with the trainer's interface."""

    supports_sequence_id = True

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf_model = hf_model

    @property
    def config(self):
        return self.hf_model.config

    @property
    def base_model(self) -> nn.Module:
        """The transformers model under any peft wrapping."""
        model = self.hf_model
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        return model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        sequence_id: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ):
        if sequence_id is not None:
            if isinstance(self.base_model, MPTForCausalLM):
                kwargs["sequence_id"] = sequence_id
            else:
                if position_ids is not None:
                    raise ValueError("hf_causal_lm: pass either sequence_id or position_ids, not both")
                # Padding is allowed where the packing collator marks it as no document (sequence_id -1): it
                # becomes a segment of its own, attends only to itself and carries no labels.
                if attention_mask is not None and bool(((attention_mask == 0) != (sequence_id < 0)).any()):
                    raise ValueError("hf_causal_lm: sequence_id cannot be combined with padding in attention_mask")
                position_ids = segment_positions(sequence_id)
                # transformers detects packed sequences only without a padding mask and without a cache
                attention_mask = None
                if past_key_values is not None or use_cache:
                    raise ValueError("hf_causal_lm: sequence_id cannot be combined with a KV cache")
                use_cache = False
        if use_cache is None and self.training:
            # no KV cache in training: with activation checkpointing the recomputed forward would append to it
            use_cache = False
        return self.hf_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_ids=position_ids,
            **kwargs,
        )

    def generate(self, *args, **kwargs):
        return self.hf_model.generate(*args, **kwargs)

    def save_pretrained(self, *args, **kwargs):
        return self.hf_model.save_pretrained(*args, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.base_model.get_input_embeddings()

    def blocks(self) -> list[nn.Module]:
        """The decoder layers: the modules transformers itself never splits across devices."""
        base = self.base_model
        names = set(getattr(base, "_no_split_modules", None) or [])
        found = [m for m in base.modules() if type(m).__name__ in names]
        if found:
            return found
        lists = [m for m in base.modules() if isinstance(m, nn.ModuleList)]
        return list(max(lists, key=len)) if lists else []

    def flops_per_token(self, seq_len: int) -> float:
        """6 * parameters (without position tables) + 12 * layers * hidden * seq_len."""
        config = self.base_model.config.get_text_config()
        n = sum(p.numel() for name, p in self.base_model.named_parameters() if "wpe" not in name.split(".")[-2:])
        layers = getattr(config, "num_hidden_layers", None) or len(self.blocks())
        hidden = getattr(config, "hidden_size", 0)
        return 6.0 * n + 12.0 * layers * hidden * seq_len


def _apply_overrides(config, overrides: dict[str, Any], prefix: str = "model.config_overrides") -> None:
    for key, value in overrides.items():
        if not hasattr(config, key):
            known = [k for k in config.to_dict()]
            raise ConfigError(f"{prefix}.{key}: the model config has no such key{did_you_mean(key, known)}")
        current = getattr(config, key)
        if isinstance(value, dict) and hasattr(current, "to_dict"):  # a sub-config
            _apply_overrides(current, value, f"{prefix}.{key}")
        elif isinstance(value, dict) and isinstance(current, dict):
            setattr(config, key, {**current, **value})
        else:
            setattr(config, key, value)


def _wrap_peft(model: nn.Module, peft_config: dict[str, Any]) -> nn.Module:
    try:
        import peft
    except ImportError as error:
        raise ConfigError("model.peft_config: needs the peft package (pip install 'llmfoundry[peft]')") from error
    values = dict(peft_config)
    peft_type = str(values.pop("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ConfigError(f"model.peft_config.peft_type: only LORA is supported, got '{peft_type}'")
    values.setdefault("task_type", "CAUSAL_LM")
    try:
        config = peft.LoraConfig(**values)
    except TypeError as error:
        raise ConfigError(f"model.peft_config: {error}") from error
    try:
        return peft.get_peft_model(model, config)
    except ValueError as error:  # e.g. target_modules that match nothing
        raise ConfigError(f"model.peft_config: {error}") from error


# transformers' attn_implementation names -> llmfoundry MPT's attn_config.attn_impl
OUR_MPT_ATTN = {"eager": "torch", "sdpa": "sdpa", "flash_attention_2": "flash"}


def _eight_bit_config():
    """transformers' 8-bit quantisation; bitsandbytes runs only on CUDA, so anywhere else it is a one-line error."""
    if not torch.cuda.is_available():
        raise ConfigError("model.load_in_8bit: needs a CUDA GPU (bitsandbytes has no CPU kernels); remove the key")
    try:
        import bitsandbytes  # noqa: F401  (an optional dependency)
    except ImportError:
        raise ConfigError("model.load_in_8bit: needs the bitsandbytes package (pip install bitsandbytes)") from None
    return BitsAndBytesConfig(load_in_8bit=True)


def load_hf_causal_lm(settings: HFModelSettings, tokenizer=None) -> HFCausalLM:
    attn = settings.attn_implementation
    if settings.use_flash_attention_2:
        if attn not in (None, "flash_attention_2"):
            raise ConfigError(f"model.use_flash_attention_2: conflicts with model.attn_implementation='{attn}'")
        attn = "flash_attention_2"
    path = settings.pretrained_model_name_or_path
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=settings.trust_remote_code,
                                            token=settings.use_auth_token)
    except (OSError, ValueError) as error:
        raise ConfigError(f"model.pretrained_model_name_or_path: cannot load a model config from '{path}' ({error})") from error
    _apply_overrides(config, settings.config_overrides)
    kwargs: dict[str, Any] = {"trust_remote_code": settings.trust_remote_code}
    if settings.use_auth_token is not None:
        kwargs["token"] = settings.use_auth_token
    if settings.init_device != "cpu":
        notice_once(f"model.init_device: '{settings.init_device}' reads the pretrained weights on every rank here "
                    "(llm-foundry reads them on rank 0 and broadcasts)")
    if settings.load_in_8bit:
        kwargs["quantization_config"] = _eight_bit_config()
    if attn is not None and config.model_type == MPTConfig.model_type:
        # Our own MPT picks its kernel with attn_config.attn_impl; transformers' switch would not reach it.
        if attn not in OUR_MPT_ATTN:
            raise ConfigError(f"model.attn_implementation: '{attn}' is not available for llmfoundry's MPT "
                              f"(use one of {', '.join(OUR_MPT_ATTN)})")
        config.attn_config = {**config.attn_config, "attn_impl": OUR_MPT_ATTN[attn]}
    elif attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        if settings.pretrained:
            model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    except (ValueError, ImportError) as error:
        if attn is None or "attn" not in str(error).lower() and "flash" not in str(error).lower():
            raise
        key = "use_flash_attention_2" if settings.use_flash_attention_2 else "attn_implementation"
        raise ConfigError(f"model.{key}: '{attn}' cannot be used with this model here ({first_line(error)})") from None
    if tokenizer is not None and len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    if settings.peft_config:
        model = _wrap_peft(model, settings.peft_config)
    return HFCausalLM(model)


@models.register("hf_causal_lm", config=HFModelSettings)
def build_hf_causal_lm(settings: HFModelSettings, tokenizer) -> HFCausalLM:
    return load_hf_causal_lm(settings, tokenizer)
