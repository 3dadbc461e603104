"""The built-in dataloaders by name, with their settings: ``text`` (data/text.py) and ``finetuning``
(data/finetuning_loader.py).

Builders are named as strings so that checking a recipe imports neither torch nor streaming; each is imported when a
loader is built (see registry.Registry.declare).
"""

from __future__ import annotations

from llmfoundry.data.loader_settings import FinetuningLoaderSettings, TextLoaderSettings
from llmfoundry.registry import dataloaders

dataloaders.declare("text", "llmfoundry.data.text:build_text_dataloader", config=TextLoaderSettings)
dataloaders.declare("finetuning", "llmfoundry.data.finetuning_loader:build_finetuning_dataloader",
                    config=FinetuningLoaderSettings)
