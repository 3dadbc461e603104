"""mosaicml logger: refused with a one-line error. It reports run metadata to the MosaicML platform (mcli) for
runs that platform launched; there is no such platform here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option
from llmfoundry.registry import loggers


@dataclass
class MosaicMLSettings:
    log_interval: Any = option(None, "Composer's key (refused with the logger)")
    ignore_keys: Any = option(None, "Composer's key (refused with the logger)")
    ignore_exceptions: Any = option(None, "Composer's key (refused with the logger)")

    def check_settings(self, path: str) -> list[str]:
        return [f"{path}: not available here: it reports to the MosaicML platform (mcli), which runs here do not "
                "use; log with wandb, mlflow, tensorboard or jsonl instead"]


@loggers.register("mosaicml", config=MosaicMLSettings)
def build_mosaicml(settings: MosaicMLSettings, run_name: str):
    raise AssertionError("validation refuses this logger before it is built")
