"""llm-foundry callbacks that this trainer refuses with a one-line error saying why and what to do instead.

async_eval launches evaluation runs on the MosaicML platform (mcli) for each checkpoint; there is no such
scheduler here, and an evaluation started beside training on the same devices would compete with it for memory.
curriculum_learning and dataset_swap switch the train loader mid-run using Composer's "iterations" and callback
state saved in its checkpoints; this trainer has neither, so the runs they describe are split by hand instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option

REASONS = {
    "async_eval": "it launches evaluation runs on the MosaicML platform (mcli), which is not available here; "
                  "evaluate checkpoints with `llmfoundry eval` (e.g. as a separate job after each save) or in the "
                  "run with icl_tasks and eval_interval",
    "curriculum_learning": "switching datasets mid-run needs Composer's iterations and callback state in "
                           "checkpoints, which this trainer does not have; train each datamix as its own run, "
                           "starting from the previous one's checkpoint (load_path, load_weights_only: false, "
                           "load_ignore_keys: [state/dataset_state]), or mix the datasets with "
                           "train_loader.dataset.streams",
    "dataset_swap": "swapping the train dataset on resume needs callback state in checkpoints, which this trainer "
                    "does not have; start the new dataset's run from the checkpoint with load_path and "
                    "load_ignore_keys: [state/dataset_state, state/timestamp]",
}


@dataclass
class _Refused:
    def check_settings(self, path: str) -> list[str]:
        name = path.rsplit(".", 1)[-1]
        return [f"{path}: not available here: {REASONS[name]}"]


@dataclass
class AsyncEvalSettings(_Refused):
    interval: Any = option(None, "llm-foundry's key (refused with the callback)")
    eval_run_config: Any = option(None, "llm-foundry's key (refused with the callback)")


@dataclass
class CurriculumLearningSettings(_Refused):
    schedule: Any = option(None, "llm-foundry's key (refused with the callback)")
    duration: Any = option(None, "llm-foundry's key (refused with the callback)")


@dataclass
class DatasetSwapSettings(_Refused):
    dataset_index: Any = option(None, "llm-foundry's key (refused with the callback)")


def refuse(settings: Any) -> None:
    """Their builder, never called: their settings' check_settings refuses them first."""
    raise AssertionError("validation refuses this callback before it is built")
