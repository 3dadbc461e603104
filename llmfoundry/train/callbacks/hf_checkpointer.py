"""hf_checkpointer: every ``save_interval``, export the model as a Hugging Face folder (transformers-native classes).

The weights are gathered from every rank (FSDP shards included) into a fresh copy of the model on rank 0, which
``llmfoundry.models.hf_export.export_hf`` writes to ``save_folder/ba{batch}`` (and at the end of training).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from llmfoundry.config.checks import TimeString
from llmfoundry.config.fields import option
from llmfoundry.core import dist, objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import export_hf
from llmfoundry.registry import callbacks
from llmfoundry.train.builders import build_model
from llmfoundry.train.callbacks.base import Callback

log = logging.getLogger(__name__)


@dataclass
class HFCheckpointerSettings:
    save_folder: str = option(doc="local folder for the exported models (one sub-folder per export: ba{batch})")
    save_interval: TimeString = option("1dur", "how often to export, e.g. 1000ba (and always at the end of training)")
    precision: Literal["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"] = option(
        "bf16", "dtype of the exported weights"
    )
    overwrite: bool = option(False, "replace an export folder that already exists")

    def check_settings(self, path: str) -> list[str]:
        if objectstore.is_remote(self.save_folder):
            return [f"{path}.save_folder: only local folders are supported yet (export locally, then copy)"]
        return []


class HFCheckpointer(Callback):
    def __init__(self, settings: HFCheckpointerSettings):
        self.s = settings
        self.every = None
        self.last = -1
        self.exported: list[Path] = []

    def on_fit_start(self, trainer):
        try:
            self.every = max(1, trainer.rates.to_batches(self.s.save_interval, "callbacks.hf_checkpointer.save_interval"))
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def on_batch_end(self, trainer, metrics):
        if trainer.time.batch % self.every == 0:
            self.export(trainer)

    def on_fit_end(self, trainer):
        if self.last != trainer.time.batch:
            self.export(trainer)

    def export(self, trainer) -> Path | None:
        """Collective: every rank calls it. Returns the folder on rank 0."""
        self.last = trainer.time.batch
        full = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        out = Path(self.s.save_folder) / f"ba{trainer.time.batch}"
        if dist.rank() == 0:
            if out.exists():
                if not self.s.overwrite:
                    raise ConfigError(f"callbacks.hf_checkpointer.save_folder: '{out}' already exists (set "
                                      "overwrite: true or choose another folder)")
                shutil.rmtree(out)
            cfg = trainer.cfg
            settings = cfg.model.settings
            if dataclasses.is_dataclass(settings) and getattr(settings, "init_device", None) == "meta":
                settings = dataclasses.replace(settings, init_device="cpu")
            copy = build_model(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, settings=settings)),
                               trainer.tokenizer)
            copy.load_state_dict(full)
            export_hf(copy.eval(), trainer.tokenizer, out, self.s.precision)  # any name in core.precision.DTYPES
            self.exported.append(out)
            trainer._print(f"hf_checkpointer: exported {out}")
        dist.barrier()
        return out if dist.rank() == 0 else None


@callbacks.register("hf_checkpointer", config=HFCheckpointerSettings)
def build_hf_checkpointer(settings: HFCheckpointerSettings) -> Callback:
    return HFCheckpointer(settings)
