"""A `record_memory` callback: torch's own memory tracker (MemTracker, or FSDPMemTracker for an FSDP2 model) around
one whole training step; its snapshots (bytes per category) written to {name}-rank{r}.json: the peak by the
end of the last backward, what is held just after it, the peak of the whole step, and (one rank) the peak of
activations + temporaries with the gradients made by then. Imported by
tests/train/test_plan.py for one rank in-process; run as ``__main__`` by the rank server for more ranks (as
tests/distributed/_train_worker.py is), where ``RECIPE [overrides] [--then overrides]...`` trains the recipe once per
part, one after the other in the same ranks and process group (one job for several cases: starting the ranks is
most of a small job's time)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainState


@dataclass
class RecordMemorySettings:
    folder: str = option(".", "where {name}-rank{r}.json goes")
    name: str = option("memory", "the file's name before -rank{r}.json")
    batch: int = option(2, "the batch (1-based) to track: the second has its optimizer state already")


class RecordMemory(Callback):
    def __init__(self, settings: RecordMemorySettings):
        self.settings = settings
        self.tracker = None

    def on_batch_start(self, state: TrainState):
        if state.time.batch + 1 != self.settings.batch:
            return
        from torch.distributed.fsdp import FSDPModule

        if isinstance(state.model, FSDPModule):
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            self.tracker = FSDPMemTracker(state.model, state.optimizer)
        else:
            from llmfoundry.train.plan_memory import ActivationPeak  # torch's MemTracker + the activations' peak

            self.tracker = ActivationPeak()
            self.tracker.track_external(state.model, state.optimizer)
        self.tracker.__enter__()

    def _snapshot(self, kind: str = "peak") -> dict[str, int]:
        (snapshot,) = self.tracker.get_tracker_snapshot(kind).values()  # one device
        return {str(getattr(k, "value", k)): v for k, v in snapshot.items()}

    def on_after_backward(self, state: TrainState, microbatch, logits):
        if self.tracker is not None:
            self.forward_backward = self._snapshot()  # the peak so far: before the optimizer step
            self.after_backward = self._snapshot("current")  # every gradient made (of the last microbatch)
            if hasattr(self.tracker, "reset_mod_stats"):  # FSDPMemTracker follows one forward per module, not
                self.tracker.reset_mod_stats()  # one per microbatch; its per-module stats only, the peaks stay

    def on_batch_end(self, state: TrainState, metrics: dict[str, float]):
        if self.tracker is None:
            return
        self.tracker.__exit__(None, None, None)
        peaks = {"forward_backward": self.forward_backward, "after_backward": self.after_backward,
                 "step": self._snapshot(), "activation_peak": getattr(self.tracker, "activation_peak", None)}
        self.tracker = None
        with open(f"{self.settings.folder}/{self.settings.name}-rank{state.dist.rank}.json", "w") as f:
            json.dump(peaks, f)


callbacks.register("record_memory", config=RecordMemorySettings)(lambda s: RecordMemory(s))


def train_each(recipe: str, args: list[str]) -> int:
    """Train ``recipe`` once per ``--then``-separated part of ``args`` (its overrides), in this process."""
    from llmfoundry.core import dist
    from llmfoundry.train.recipe import load_train_config
    from llmfoundry.train.trainer import Trainer

    parts: list[list[str]] = [[]]
    for arg in args:
        parts.append([]) if arg == "--then" else parts[-1].append(arg)
    try:
        for overrides in parts:
            cfg, plain = load_train_config(recipe, overrides)
            Trainer(cfg, plain).fit()  # the process group stays up between runs (dist.init_distributed reuses it)
    finally:
        dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(train_each(sys.argv[1], sys.argv[2:]))
