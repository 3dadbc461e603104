"""torchrun entry point for tests: `llmfoundry train` plus a `record_samples` callback that writes, per rank and
batch, a hash of every sample row trained on (to check that no sample is seen twice), and a `record_shapes`
callback that writes the shape of each parameter's local part on each rank (to check how the model was split)."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback


@dataclass
class RecordSamplesSettings:
    folder: str = option(".", "where samples-rank{r}.jsonl goes")


class RecordSamples(Callback):
    def __init__(self, settings: RecordSamplesSettings):
        self.folder = settings.folder

    def on_batch_start(self, trainer):
        rows = [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:16] for r in trainer.batch["input_ids"].cpu()]
        path = f"{self.folder}/samples-{trainer.dist.world_size}x-rank{trainer.dist.rank}.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps({"rank": trainer.dist.rank, "batch": trainer.time.batch + 1, "rows": rows}) + "\n")


callbacks.register("record_samples", config=RecordSamplesSettings)(lambda s: RecordSamples(s))


class RecordShapes(Callback):
    def __init__(self, settings: RecordSamplesSettings):
        self.folder = settings.folder

    def on_fit_start(self, trainer):
        shapes = {name: list(getattr(p, "_local_tensor", p).shape) for name, p in trainer.model.named_parameters()}
        with open(f"{self.folder}/shapes-rank{trainer.dist.rank}.json", "w") as f:
            json.dump(shapes, f)


callbacks.register("record_shapes", config=RecordSamplesSettings)(lambda s: RecordShapes(s))

if __name__ == "__main__":
    from llmfoundry.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
