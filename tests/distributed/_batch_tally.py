"""A test-only piece of checkpointed state, in one file: the ``batch_tally`` callback (recipes load it with
``code_paths``). It counts the batches it has seen and sums their global losses; declaring ``state_name`` is all it
takes for checkpoints to carry that across a resume (train.components). Rank 0 appends what it holds after each
batch to ``tally.jsonl`` in ``folder``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainState


@dataclass
class BatchTallySettings:
    folder: str = option(".", "where rank 0 writes tally.jsonl")


class BatchTally(Callback):
    state_name = "batch_tally"

    def __init__(self, settings: BatchTallySettings):
        self.folder = settings.folder
        self.batches = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64)

    def on_batch_end(self, state: TrainState, metrics):
        self.batches += 1
        self.loss_sum += metrics["loss/train/total"]
        if state.dist.rank == 0:
            with open(Path(self.folder) / "tally.jsonl", "a") as f:
                f.write(json.dumps({"batch": state.time.batch, "tally": self.batches,
                                    "loss_sum": float(self.loss_sum), "world_size": state.dist.world_size}) + "\n")

    def state_dict(self) -> dict:
        return {"batches": self.batches, "loss_sum": self.loss_sum.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.batches, self.loss_sum = int(state["batches"]), state["loss_sum"].clone()


callbacks.register("batch_tally", config=BatchTallySettings)(lambda s: BatchTally(s))
