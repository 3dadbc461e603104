"""`model.name: hf_t5`: transformers' T5ForConditionalGeneration (encoder-decoder) behind the trainer's interface.

llm-foundry's ComposerHFT5, with its keys. It trains on the finetuning loader's encoder-decoder batches
(``decoder_only_format: false``, see data/finetuning_collator.py): the context goes through the encoder, the decoder
reads ``decoder_input_ids`` (the target one position on, after the pad token T5 starts with) and its logits are
scored against ``labels`` without a shift (``is_encoder_decoder``: models.interface.label_offset is 0). The
encoder's and the decoder's T5Blocks are the blocks FSDP2 shards and activation checkpointing recomputes, in the
order they run (encoder first), so forward prefetching follows the computation.
"""

from __future__ import annotations

import pickle

import torch
from torch import nn
from transformers import AutoConfig, T5ForConditionalGeneration

from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.core.notices import notice_once
from llmfoundry.models.hf import HFCausalLM, apply_config_overrides
from llmfoundry.models.settings import HFT5Settings


class HFT5(HFCausalLM):
    """A T5ForConditionalGeneration with the trainer's interface (blocks, FLOPs, init come from HFCausalLM)."""

    supports_sequence_id = False  # packing is refused for encoder-decoder batches, as in llm-foundry
    is_encoder_decoder = True  # logits[t] is scored against labels[t]; forward takes the decoder's inputs

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ):
        if decoder_input_ids is None and labels is None:
            raise ConfigError("model.name: hf_t5 needs encoder-decoder batches (a finetuning loader with "
                              "dataset.decoder_only_format: false)")
        if use_cache is None and self.training:  # no KV cache in training (activation checkpointing recomputes)
            use_cache = False
        return self.hf_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                             decoder_attention_mask=decoder_attention_mask, labels=labels, use_cache=use_cache,
                             **kwargs)

    def flops_per_token(self, seq_len: int) -> float:
        """6 * parameters + 12 * inner attention width * seq_len per attention layer (the encoder's self-attention,
        the decoder's self- and cross-attention), with encoder and decoder sequences taken as ``seq_len`` long."""
        config = self.base_model.config
        n = sum(p.numel() for p in self.base_model.parameters())
        inner = config.num_heads * config.d_kv
        attention_layers = config.num_layers + 2 * config.num_decoder_layers
        return 6.0 * n + 12.0 * attention_layers * inner * seq_len


def load_hf_t5(settings: HFT5Settings, tokenizer=None) -> HFT5:
    path = settings.pretrained_model_name_or_path
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=settings.trust_remote_code,
                                            token=settings.use_auth_token)
    except (OSError, ValueError) as error:
        raise ConfigError(f"model.pretrained_model_name_or_path: cannot load a model config from '{path}' "
                          f"({first_line(error)})") from None
    apply_config_overrides(config, settings.config_overrides)
    if not getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model.pretrained_model_name_or_path: '{path}' is not an encoder-decoder model (its config "
                          "has is_encoder_decoder false); hf_t5 trains T5 models, use hf_causal_lm for this one")
    on_meta = settings.init_device == "meta" or (settings.init_device == "mixed" and not settings.pretrained)
    if settings.init_device == "mixed" and settings.pretrained:
        notice_once("model.init_device: 'mixed' with pretrained hf_t5 weights: every rank reads the folder")
    try:
        if on_meta:
            with torch.device("meta"):
                model = T5ForConditionalGeneration(config)
        elif settings.pretrained:
            token = {} if settings.use_auth_token is None else {"token": settings.use_auth_token}
            model = T5ForConditionalGeneration.from_pretrained(path, config=config, **token)
        else:
            model = T5ForConditionalGeneration(config)
    except (AttributeError, TypeError, ValueError, OSError, pickle.UnpicklingError) as error:
        # (UnpicklingError: transformers reads .bin weights with weights_only=True and refuses anything else)
        raise ConfigError(f"model.pretrained_model_name_or_path: '{path}' cannot be built as transformers' "
                          f"T5ForConditionalGeneration ({first_line(error)})") from None
    _check_decoder_start(model, tokenizer)
    return HFT5(model)


def _check_decoder_start(model: nn.Module, tokenizer) -> None:
    """The collator starts the decoder with the tokenizer's pad token, as llm-foundry's does: a tokenizer without one
    is an error there too; a model whose own start token differs is trained as llm-foundry trains it, with a notice
    (generation afterwards starts from the model's token)."""
    if tokenizer is None:
        return
    pad, start = tokenizer.pad_token_id, model.config.decoder_start_token_id
    if pad is None:
        raise ConfigError("tokenizer: hf_t5 needs a tokenizer with a pad token (the decoder's inputs start with it, as "
                          "in llm-foundry); set tokenizer.kwargs.pad_token")
    if start is not None and start != pad:
        notice_once(f"model: the decoder's inputs start with the tokenizer's pad token {pad} (as in llm-foundry), but "
                    f"the model's decoder_start_token_id is {start}")


def build_hf_t5(settings: HFT5Settings, tokenizer) -> HFT5:
    """The `hf_t5` builder (declared in models/catalog.py)."""
    return load_hf_t5(settings, tokenizer)
