"""The run's name, and ``{run_name}`` expanded in the path keys where Composer and llm-foundry expand it.

The name is the recipe's ``run_name``, else the ``RUN_NAME`` environment variable (llm-foundry reads it), else
``COMPOSER_RUN_NAME`` (Composer's trainer reads it), else a generated ``llmfoundry-YYYYmmdd-HHMMSS``; rank 0's
choice is used on every rank. ``{run_name}`` is then replaced in ``save_folder`` (Composer's checkpoint saver),
``load_path`` (Composer's checkpoint loader), ``callbacks.hf_checkpointer.save_folder`` (llm-foundry's
HuggingFaceCheckpointer) and ``loggers.jsonl.path`` (as Composer's file logger does with its file name), once,
before anything reads them. Composer's other placeholders (``{rank}``, ``{batch}``, ...) are not expanded here:
in those keys they are a one-line error, never a folder literally named ``{rank}``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.recipe import TrainConfig

# (section, registered name, field) of the registered components whose paths expand {run_name}
COMPONENT_PATHS = (("callbacks", "hf_checkpointer", "save_folder"), ("loggers", "jsonl", "path"))
TOP_LEVEL_PATHS = ("save_folder", "load_path")
# Composer's format_name_with_dist(_and_time) names besides run_name
_COMPOSER_NAMES = {"rank", "local_rank", "world_size", "local_world_size", "node_rank", "epoch", "batch", "sample",
                   "token", "batch_in_epoch", "sample_in_epoch", "token_in_epoch", "total_wct", "epoch_wct",
                   "batch_wct"}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def given_run_name(configured: str | None, environ) -> str | None:
    """The recipe's run_name, else $RUN_NAME (llm-foundry), else $COMPOSER_RUN_NAME (Composer); None if none."""
    return configured or environ.get("RUN_NAME") or environ.get("COMPOSER_RUN_NAME") or None


def generate_run_name() -> str:
    return time.strftime("llmfoundry-%Y%m%d-%H%M%S")


def expand(text: str | None, run_name: str, key: str) -> str | None:
    """``text`` with ``{run_name}`` replaced; Composer's other placeholders are a ConfigError naming ``key``."""
    if text is None:
        return None
    for name in _PLACEHOLDER.findall(text):
        if name in _COMPOSER_NAMES:
            raise ConfigError(f"{key}: '{{{name}}}' in '{text}' is not expanded here, only {{run_name}} is "
                              f"(remove '{{{name}}}'; one folder serves all ranks and every checkpoint)")
    return text.replace("{run_name}", run_name)


def with_run_name(cfg: TrainConfig, run_name: str, generated: bool = False) -> TrainConfig:
    """A copy of ``cfg`` whose path keys have ``{run_name}`` expanded. With a ``generated`` name, autoresume from
    a save_folder that contains ``{run_name}`` could never find the run again: that is an error, as in Composer."""
    if generated and cfg.autoresume and cfg.save_folder and "{run_name}" in cfg.save_folder:
        raise ConfigError(f"autoresume: save_folder '{cfg.save_folder}' contains {{run_name}} but no run_name is "
                          "set, so a restarted run would look in a new folder (set run_name, or RUN_NAME in the "
                          "environment)")
    changes: dict = {key: expand(getattr(cfg, key), run_name, key) for key in TOP_LEVEL_PATHS}
    for section, name, field in COMPONENT_PATHS:
        entries = getattr(cfg, section)
        settings = entries.get(name)
        if settings is None or getattr(settings, field, None) is None:
            continue
        value = expand(getattr(settings, field), run_name, f"{section}.{name}.{field}")
        changes[section] = {**changes.get(section, entries), name: dataclasses.replace(settings, **{field: value})}
    return dataclasses.replace(cfg, **changes)


def resolve_run_name(cfg: TrainConfig, broadcast: Callable[[str], str] = lambda name: name) -> tuple[str, TrainConfig]:
    """(the run's name, the same on every rank: rank 0's, through ``broadcast``, e.g. core.dist.broadcast_object;
    ``cfg`` with ``{run_name}`` expanded in its paths). This module stays free of torch: launchers use it too."""
    given = given_run_name(cfg.run_name, os.environ)
    name = broadcast(given or generate_run_name())
    return name, with_run_name(cfg, name, generated=given is None)
