"""The built-in loggers by name: each name with its settings (``settings``) and the ``module:function`` that builds
it, imported only when a run builds that logger."""

from __future__ import annotations

from llmfoundry.registry import loggers
from llmfoundry.train.loggers.settings import (
    InMemorySettings,
    JsonlSettings,
    MLflowSettings,
    MosaicMLSettings,
    TensorboardSettings,
    WandbSettings,
)

IN_MEMORY_DIFFERS = "timestamps hold epoch, batch, sample and token, without wall-clock durations"

loggers.declare("jsonl", "llmfoundry.train.loggers.jsonl:build_jsonl", config=JsonlSettings)
loggers.declare("inmemory", "llmfoundry.train.loggers.in_memory:build_in_memory", config=InMemorySettings,
                differs=IN_MEMORY_DIFFERS)
# llm-foundry's older name
loggers.declare("in_memory_logger", "llmfoundry.train.loggers.in_memory:build_in_memory", config=InMemorySettings,
                differs=IN_MEMORY_DIFFERS)
loggers.declare("mlflow", "llmfoundry.train.loggers.mlflow:build_mlflow", config=MLflowSettings,
                differs="params are the flattened config (model.n_layers, ...; Composer: one string per top-level "
                        "key); no dataset inputs are logged (llm-foundry logs its loaders' sources)")
loggers.declare("wandb", "llmfoundry.train.loggers.wandb:build_wandb", config=WandbSettings)
loggers.declare("tensorboard", "llmfoundry.train.loggers.tensorboard:build_tensorboard", config=TensorboardSettings,
                differs="writes the hparams once, when the run ends (Composer: after each evaluation), and the "
                        "config and the callbacks' tables as text (Composer writes neither)")
# refused with a one-line error (its settings' check_settings says why) before it is built
loggers.declare("mosaicml", "llmfoundry.train.loggers.mosaicml:build_mosaicml", config=MosaicMLSettings)
