"""`model.name: hf_causal_lm`: any transformers AutoModelForCausalLM behind the trainer's model interface.

The wrapper adds what the trainer relies on (the ``CausalLM`` protocol of models/interface.py) and optionally
wraps the model in LoRA adapters through the ``peft`` library. Packed examples (``sequence_id``) are seen as
llm-foundry's models see them: Composer passes a transformers model only the arguments its forward names, so
GPT-2, Llama & co. get no ``sequence_id`` and packed examples attend to each other with positions running on
(a notice says so once). ``attn_uses_sequence_id: true`` keeps them apart instead: position ids restart at each
example, which transformers reads as packed sequences. An MPT folder gets ``sequence_id`` (its forward names it).
"""

from __future__ import annotations

import functools
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig, GenerationConfig

from llmfoundry.core.errors import ConfigError, did_you_mean, first_line, refusal_reason
from llmfoundry.core.notices import notice_once
from llmfoundry.models.hf_import import is_llm_foundry_mpt_folder
from llmfoundry.models.interface import ModelHooks
from llmfoundry.models.layers.positional import segment_positions
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM  # importing it lets the Auto classes open our MPT
from llmfoundry.models.pretrained_weights import PretrainedWeights, safetensors_files
from llmfoundry.models.settings import HFModelSettings


class HFCausalLM(nn.Module):
    """A transformers causal LM (optionally with peft adapters) with the trainer's interface."""

    supports_sequence_id = True
    # should_save_peft_only and LoRA active (set by load_hf_causal_lm): checkpoints then save only the adapters,
    # as Composer's HuggingFaceModel.state_dict does
    saves_adapters_only = False
    pretrained_weights = None  # set by load_hf_causal_lm for a meta model read from its folder after sharding

    def __init__(self, hf_model: nn.Module, attn_uses_sequence_id: bool = False):
        super().__init__()
        self.hf_model = hf_model
        self.attn_uses_sequence_id = attn_uses_sequence_id
        # id -> 'lora_A' / 'lora_B' for peft's adapter matrices (modules named <layer>.lora_A.<adapter name>)
        self._lora_matrices = {id(m): n.split(".")[-2] for n, m in hf_model.named_modules()
                               if n.count(".") and n.split(".")[-2] in ("lora_A", "lora_B")}

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
            elif not self.attn_uses_sequence_id:  # as Composer's HuggingFaceModel: the forward has no such argument
                notice_once("model.attn_uses_sequence_id: packed examples attend to each other and their positions "
                            "run on, as llm-foundry trains hf_causal_lm models; set it to true to keep them apart")
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
                if past_key_values is not None or kwargs.get("cache") is not None or use_cache:
                    raise ValueError("hf_causal_lm: sequence_id cannot be combined with a KV cache")
                use_cache = False
        if use_cache is None and self.training:
            # no KV cache in training: with activation checkpointing the recomputed forward would append to it
            use_cache = False
        if past_key_values is not None:  # transformers >= 5.24 names it ``cache`` (in kwargs then) and renames this
            kwargs["past_key_values"] = past_key_values
        return self.hf_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
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

    def model_hooks(self) -> ModelHooks:
        return ModelHooks(init_parameters=self.init_parameters, init_module=self._init_weights,
                          pretrained_weights=self.pretrained_weights, saves_adapters_only=self.saves_adapters_only,
                          tie_word_embeddings=bool(getattr(self.config, "tie_word_embeddings", False)))

    def blocks(self) -> list[nn.Module]:
        """The decoder layers: the modules transformers itself never splits across devices."""
        base = self.base_model
        names = set(getattr(base, "_no_split_modules", None) or [])
        # by class and base classes: FSDP2 subclasses a sharded block's class (T5Block -> FSDPT5Block)
        found = [m for m in base.modules() if any(c.__name__ in names for c in type(m).__mro__)]
        if found:
            return found
        lists = [m for m in base.modules() if isinstance(m, nn.ModuleList)]
        return list(max(lists, key=len)) if lists else []

    def _init_weights(self, module: nn.Module) -> None:
        """One module's initial values (train/parallel.py materialises a meta model module by module): LoRA's
        B matrices start at zero and its A matrices as nn.Linear does, as in peft; the rest as transformers does."""
        name = self._lora_matrices.get(id(module))
        if name == "lora_B":
            nn.init.zeros_(module.weight)
        elif name == "lora_A":
            module.reset_parameters()
        else:
            self.base_model._init_weights(module)

    def init_parameters(self) -> None:
        for module in self.modules():
            if module is not self:
                self._init_weights(module)

    def flops_per_token(self, seq_len: int) -> float:
        """6 * parameters (without position tables) + 12 * layers * hidden * seq_len."""
        config = self.base_model.config.get_text_config()
        n = sum(p.numel() for name, p in self.base_model.named_parameters() if "wpe" not in name.split(".")[-2:])
        layers = getattr(config, "num_hidden_layers", None) or len(self.blocks())
        hidden = getattr(config, "hidden_size", 0)
        return 6.0 * n + 12.0 * layers * hidden * seq_len


def apply_config_overrides(config, overrides: dict[str, Any], prefix: str = "model.config_overrides") -> None:
    for key, value in overrides.items():
        if not hasattr(config, key):
            known = [k for k in config.to_dict()]
            raise ConfigError(f"{prefix}.{key}: the model config has no such key{did_you_mean(key, known)}")
        current = getattr(config, key)
        if isinstance(value, dict) and hasattr(current, "to_dict"):  # a sub-config
            apply_config_overrides(current, value, f"{prefix}.{key}")
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
    if not settings.trust_remote_code and is_llm_foundry_mpt_folder(path):
        raise ConfigError(f"model.pretrained_model_name_or_path: '{path}' is llm-foundry's MPT export, which "
                          "transformers' own MPT cannot read; use model.name: mpt_causal_lm with the same path (read "
                          "without its code), or set trust_remote_code: true to run the folder's code")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=settings.trust_remote_code,
                                            token=settings.use_auth_token)
    except (OSError, ValueError) as error:
        if "trust_remote_code" in str(error) and not settings.trust_remote_code:
            raise ConfigError(f"model.pretrained_model_name_or_path: '{path}' needs its own Python code to load (its "
                              "config.json has auto_map), which is not run unless model.trust_remote_code: true (set "
                              "it only for a folder you trust)") from None
        raise ConfigError(f"model.pretrained_model_name_or_path: cannot load a model config from '{path}' "
                          f"({first_line(error)})") from None
    apply_config_overrides(config, settings.config_overrides)
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model.pretrained_model_name_or_path: '{path}' is an encoder-decoder model "
                          f"({config.model_type}); train it with model.name: hf_t5 (hf_causal_lm, eval, generate and "
                          "chat take decoder-only models)")
    kwargs: dict[str, Any] = {"trust_remote_code": settings.trust_remote_code}
    on_meta = settings.init_device in ("meta", "mixed")
    if settings.load_in_8bit:
        kwargs["quantization_config"] = _eight_bit_config()
        if on_meta and settings.pretrained:  # bitsandbytes quantises while transformers reads the weights
            notice_once(f"model.init_device: '{settings.init_device}' with load_in_8bit: every rank reads the "
                        "whole model (quantised as it is read)")
            on_meta = False
    if attn is not None and config.model_type == MPTConfig.model_type:
        # Our own MPT picks its kernel with attn_config.attn_impl; transformers' switch would not reach it.
        if attn not in OUR_MPT_ATTN:
            raise ConfigError(f"model.attn_implementation: '{attn}' is not available for llmfoundry's MPT "
                              f"(use one of {', '.join(OUR_MPT_ATTN)})")
        config.attn_config = {**config.attn_config, "attn_impl": OUR_MPT_ATTN[attn]}
    elif attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        model = _build_transformers_model(settings, config, kwargs, on_meta)
    except (ValueError, ImportError) as error:
        if attn is None or "attn" not in str(error).lower() and "flash" not in str(error).lower():
            raise
        key = "use_flash_attention_2" if settings.use_flash_attention_2 else "attn_implementation"
        raise ConfigError(f"model.{key}: '{attn}' cannot be used with this model here ({first_line(error)})") from None
    _check_vocab(model, tokenizer, settings.allow_embedding_resizing, on_meta)
    if settings.pretrained_lora_id_or_path:
        model = _continue_lora(model, settings)
    elif settings.peft_config:
        model = _wrap_peft(model, settings.peft_config)
    wrapped = HFCausalLM(model, settings.attn_uses_sequence_id)
    if settings.attn_uses_sequence_id and isinstance(wrapped.base_model, MPTForCausalLM):
        raise ConfigError("model.attn_uses_sequence_id: an MPT folder reads sequence_id as its own config says; set "
                          "config_overrides: {attn_config: {attn_uses_sequence_id: true}} instead")
    wrapped.saves_adapters_only = settings.should_save_peft_only and hasattr(model, "peft_config")
    if on_meta and settings.pretrained:  # train/parallel.py reads them into the (sharded) model
        wrapped.pretrained_weights = _weight_files(wrapped, settings)
    return wrapped


def _build_transformers_model(settings: HFModelSettings, config, kwargs: dict[str, Any], on_meta: bool) -> nn.Module:
    """The pretrained model on the CPU, or the folder's architecture without storage (meta / mixed: the weights
    are read after sharding, see models/pretrained_weights.py)."""
    path = settings.pretrained_model_name_or_path
    if settings.pretrained and not on_meta:
        token = {} if settings.use_auth_token is None else {"token": settings.use_auth_token}
        try:
            return AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs, **token)
        except pickle.UnpicklingError as error:  # transformers reads .bin weights with weights_only=True
            files = sorted(p.name for p in Path(path).glob("*.bin")) if Path(path).is_dir() else []
            raise ConfigError(f"model.pretrained_model_name_or_path: '{path}': its weights ({', '.join(files)}) hold "
                              f"more than tensors, refused unread ({refusal_reason(error)})") from None
    if not on_meta:
        return AutoModelForCausalLM.from_config(config, **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    model.tie_weights()
    try:  # from_pretrained would read it; from_config does not
        model.generation_config = GenerationConfig.from_pretrained(path, token=settings.use_auth_token)
    except OSError:
        pass
    return model


def _check_vocab(model: nn.Module, tokenizer, allow_resizing: bool, on_meta: bool) -> None:
    """A tokenizer with more tokens than the embedding has rows: grown with allow_embedding_resizing, else an error
    (token ids past the table would fail in training), as in llm-foundry."""
    rows = model.get_input_embeddings().num_embeddings
    if tokenizer is None or len(tokenizer) <= rows:
        return
    if not allow_resizing:
        raise ConfigError(f"model.allow_embedding_resizing: the tokenizer has {len(tokenizer)} tokens but the model's "
                          f"embedding only {rows} rows (set allow_embedding_resizing: true to grow it, or use the "
                          "model's own tokenizer)")
    # on meta there are no weights yet to average for the new rows: they get the model's initialisation
    model.resize_token_embeddings(len(tokenizer), mean_resizing=not on_meta)


def _continue_lora(model: nn.Module, settings: HFModelSettings) -> nn.Module:
    """A trained LoRA adapter folder on the base model, its adapters trainable (pretrained_lora_id_or_path)."""
    if settings.peft_config:
        raise ConfigError("model.pretrained_lora_id_or_path: the adapter folder brings its own LoRA config; remove "
                          "model.peft_config")
    try:
        import peft
    except ImportError as error:
        raise ConfigError("model.pretrained_lora_id_or_path: needs the peft package (pip install "
                          "'llmfoundry[peft]')") from error
    source = settings.pretrained_lora_id_or_path
    try:
        with warnings.catch_warnings():
            # on the meta device peft's copy of the adapter weights is a no-op (torch warns for each tensor);
            # train/parallel.py reads them from the adapter folder with the base weights
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
            return peft.PeftModel.from_pretrained(model, source, is_trainable=True, token=settings.use_auth_token)
    except (OSError, ValueError) as error:
        raise ConfigError(f"model.pretrained_lora_id_or_path: cannot load a LoRA adapter from '{source}' "
                          f"({first_line(error)})") from None


def _weight_files(model: HFCausalLM, settings: HFModelSettings) -> PretrainedWeights:
    """The base model's safetensors (names without the wrappers' prefixes) and, when continuing a LoRA, the
    adapter's (names without the adapter's name, as peft saves them)."""
    prefix = model.base_model.base_model_prefix + "."
    sources = [(_local_files(settings.pretrained_model_name_or_path, settings, "model.pretrained_model_name_or_path"),
                functools.partial(_base_key, prefix=prefix))]
    if settings.pretrained_lora_id_or_path:
        sources.append((_local_files(settings.pretrained_lora_id_or_path, settings, "model.pretrained_lora_id_or_path"),
                        _adapter_key))
    return PretrainedWeights(sources, "model.pretrained_model_name_or_path")


def _local_files(source: str, settings: HFModelSettings, key: str) -> dict:
    folder = Path(source)
    if not folder.is_dir():  # a hub id: its files in the local cache (downloaded there if missing)
        folder = Path(snapshot_download(source, allow_patterns=["*.safetensors", "*.json"],
                                        token=settings.use_auth_token))
    return safetensors_files(folder, key)


def _base_key(name: str, prefix: str) -> list[str]:
    """hf_model.[base_model.model.]model.layers.0.q_proj[.base_layer].weight -> model.layers.0.q_proj.weight, or
    layers.0.q_proj.weight in a folder saved from the bare base model (without the causal LM's ``model.``)."""
    name = name.removeprefix("hf_model.").removeprefix("base_model.model.").replace(".base_layer.", ".")
    return [name, name.removeprefix(prefix)] if name.startswith(prefix) else [name]


def _adapter_key(name: str) -> list[str]:
    """hf_model.base_model.model.<layer>.lora_A.default.weight -> base_model.model.<layer>.lora_A.weight (peft
    saves adapters without their adapter name)."""
    parts = name.removeprefix("hf_model.").split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            return [".".join(parts[: i + 1] + parts[i + 2 :])]
    return []


def build_hf_causal_lm(settings: HFModelSettings, tokenizer) -> HFCausalLM:
    """The `hf_causal_lm` builder (declared in models/catalog.py)."""
    return load_hf_causal_lm(settings, tokenizer)
