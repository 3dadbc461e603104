"""Turn validated config sections into objects through the registry (the one place builders are called).

Each builder receives its own section of the recipe (and what it must know from elsewhere, as arguments), never
the whole recipe."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from llmfoundry import registry
from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.data import tokenizers
from llmfoundry.models.interface import check_causal_lm
from llmfoundry.train.recipe import Component, TokenizerConfig


def build_tokenizer(section: TokenizerConfig, max_seq_len: int):
    """The recipe's ``tokenizer``; its ``model_max_length`` defaults to the run's ``max_seq_len``."""
    kwargs = dict(section.kwargs)
    kwargs.setdefault("model_max_length", max_seq_len)
    return tokenizers.build_tokenizer(section.name, kwargs)


def build_model(section: Component, tokenizer) -> nn.Module:
    """The recipe's ``model``, checked against the CausalLM protocol."""
    model = registry.models.get(section.name, key="model.name").builder(section.settings, tokenizer)
    check_causal_lm(model, f"model.name: '{section.name}'")
    return model


def build_dataloader(section: Component, tokenizer, device_batch_size: int, key: str, share: dist.DataShare):
    """The loader of ``section`` (the recipe's ``train_loader``, ``eval_loader``, ...) for this rank's ``share`` of
    the data; ``key`` names it in errors. A registered builder takes ``(settings, tokenizer, device_batch_size, *,
    key, share)``."""
    entry = registry.dataloaders.get(section.name, key=f"{key}.name")
    if "share" in inspect.signature(entry.builder).parameters:
        return entry.builder(section.settings, tokenizer, device_batch_size, key=key, share=share)
    if share.replication > 1:  # a plugin loader written before DataShare: it would deal by world rank
        raise ConfigError(f"{key}.name: the '{section.name}' loader takes no share= argument, so it cannot give the "
                          f"{share.replication} ranks of a tensor-parallel group the same batches")
    return entry.builder(section.settings, tokenizer, device_batch_size, key=key)


def build_optimizer(section: Component, model: nn.Module):
    return registry.optimizers.get(section.name, key="optimizer.name").builder(section.settings, model)


def build_schedule(section: Component | None, rates):
    """The learning-rate multiplier as a function of the trainer's time (constant 1 without a scheduler)."""
    if section is None:
        return lambda now: 1.0
    entry = registry.schedulers.get(section.name, key="scheduler.name")
    try:
        return entry.builder(section.settings, rates)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def build_named(reg: registry.Registry, sections: dict[str, Any], *args) -> list[Any]:
    """Callbacks, loggers or algorithms: one object per configured name, in config order."""
    return [reg.get(name).builder(settings, *args) for name, settings in sections.items()]
