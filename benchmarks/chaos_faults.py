"""The faults benchmarks/chaos.py sets off from inside a training run (a code_paths file of its recipes), armed by
environment variables: CHAOS_NAN_AT=N makes batch N's loss NaN (a forward hook on the input embeddings);
CHAOS_STALL_AT=N makes rank 1 touch CHAOS_STALL_FLAG and sleep 30 s before batch N (its peer waits in a
collective); CHAOS_HOLD_AT=N makes every rank wait before batch N until CHAOS_HOLD_FLAG exists (the job stays alive,
its data loaded and its shared memory mapped, while the benchmark starts something beside it)."""

import os
import time
from dataclasses import dataclass

import torch

from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback


@dataclass
class Nothing:
    pass


class Faults(Callback):
    def __init__(self):
        self.nan_at = int(os.environ.get("CHAOS_NAN_AT", "0"))
        self.stall_at = int(os.environ.get("CHAOS_STALL_AT", "0"))
        self.hold_at = int(os.environ.get("CHAOS_HOLD_AT", "0"))
        self.hook = None

    def on_batch_start(self, trainer):
        batch = trainer.time.batch + 1
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if batch == self.nan_at:
            self.hook = trainer.model.get_input_embeddings().register_forward_hook(lambda m, i, out: out * torch.nan)
        if batch == self.stall_at and trainer.dist.rank == 1:
            open(os.environ["CHAOS_STALL_FLAG"], "w").close()
            time.sleep(30)
        if batch == self.hold_at:
            deadline = time.monotonic() + 600
            while not os.path.exists(os.environ["CHAOS_HOLD_FLAG"]) and time.monotonic() < deadline:
                time.sleep(0.05)


callbacks.register("chaos_faults", config=Nothing)(lambda s: Faults())
