"""llm-foundry's only_hf_checkpoint / only_composer_checkpoint: write one checkpoint of the model as built (and
loaded from load_path) and stop without training."""

from __future__ import annotations

from typing import Any

from llmfoundry.train.callbacks.hf_checkpointer import HFCheckpointer


def write_only_checkpoint(trainer: Any) -> None:
    """only_hf_checkpoint: the hf_checkpointer callback exports a Hugging Face folder (validation made sure there
    is one); only_composer_checkpoint: one checkpoint in save_folder (validation made sure it is set)."""
    cfg = trainer.cfg
    if cfg.only_hf_checkpoint:
        exporter = next(cb for cb in trainer.callbacks if isinstance(cb, HFCheckpointer))
        exporter.export(trainer.state)
    else:
        trainer.save()
        trainer.finish_uploads()
    for logger in trainer.loggers:
        logger.close()
