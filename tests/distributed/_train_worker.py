"""torchrun entry point for tests: `llmfoundry train` plus a `record_samples` callback that writes, per rank and
batch, a hash of every sample row trained on (to check that no sample is seen twice), a `record_shapes`
callback that writes the shape of each parameter's local part on each rank (to check how the model was split),
a `record_lr` callback that writes the learning rate of each batch's step,
a `print_env_hash` callback that prints the hash of a secret the job reads from its environment, and
a `hold` callback that parks every rank at the end of a batch until the test has done what it wanted to do there
(a signal, a kill, a flag file): faults land at a known batch however fast or slow the machine is."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainState


@dataclass
class RecordSamplesSettings:
    folder: str = option(".", "where samples-rank{r}.jsonl goes")


class RecordSamples(Callback):
    def __init__(self, settings: RecordSamplesSettings):
        self.folder = settings.folder

    def on_batch_start(self, state: TrainState):
        rows = [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:16] for r in state.batch["input_ids"].cpu()]
        path = f"{self.folder}/samples-{state.dist.world_size}x-rank{state.dist.rank}.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps({"rank": state.dist.rank, "batch": state.time.batch + 1, "rows": rows}) + "\n")


callbacks.register("record_samples", config=RecordSamplesSettings)(lambda s: RecordSamples(s))


class RecordShapes(Callback):
    def __init__(self, settings: RecordSamplesSettings):
        self.folder = settings.folder

    def on_fit_start(self, state: TrainState):
        shapes = {name: list(getattr(p, "_local_tensor", p).shape) for name, p in state.model.named_parameters()}
        with open(f"{self.folder}/shapes-rank{state.dist.rank}.json", "w") as f:
            json.dump(shapes, f)


callbacks.register("record_shapes", config=RecordSamplesSettings)(lambda s: RecordShapes(s))


@dataclass
class HoldSettings:
    batch: int = option(5, "hold at the end of this batch (before it is logged, saved or checked for preemption)")
    folder: str = option(".", "where held-b{batch}-rank{r} is written when the hold begins, and where "
                              "release-b{batch} is looked for")
    release: bool = option(True, "wait for the file release-b{batch}; false: only a signal or a kill ends it")
    ray_preemption: bool = option(False, "after the release, also wait until Ray's preemption notice has arrived")


class Hold(Callback):
    """On the first attempt only (a rank whose held-b{batch}-rank{r} marker exists goes on: a resumed run), each
    rank writes its marker at the end of ``batch`` and waits there for the test (launch_helpers.wait_until_held).
    Registered three times (`hold`, `second_hold`, `third_hold`) for a test that parks the ranks at several batches."""

    def __init__(self, settings: HoldSettings):
        self.settings = settings

    def on_batch_end(self, state: TrainState, metrics):
        s = self.settings
        marker = Path(s.folder, f"held-b{s.batch}-rank{state.dist.rank}")
        if state.time.batch != s.batch or marker.exists():
            return
        marker.touch()
        deadline = time.monotonic() + 600  # a test that failed before releasing must not leave jobs behind
        # a signal (scancel, a requeue signal, torchrun stopping the group) ends the hold too: what the rank does on
        # it is what the test is about
        release = Path(s.folder, f"release-b{s.batch}")
        while not (s.release and release.exists()) and not state.preemption.signalled:
            if time.monotonic() > deadline:
                raise RuntimeError(f"hold: not released within 600 s of batch {s.batch}")
            time.sleep(0.05)
        if s.ray_preemption:
            self.await_ray_preemption_notice()

    @staticmethod
    def await_ray_preemption_notice() -> None:
        """Ray's watcher polls a drained node every RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S: wait here for its notice
        (every rank asks as often as the others: the call is a barrier), so the worker's RayReport sees it at this
        very batch."""
        import ray.train

        deadline = time.monotonic() + 120
        while ray.train.get_preemption_info() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("hold: no Ray preemption notice within 120 s of the release")
            time.sleep(0.2)


callbacks.register("hold", config=HoldSettings)(lambda s: Hold(s))
callbacks.register("second_hold", config=HoldSettings)(lambda s: Hold(s))
callbacks.register("third_hold", config=HoldSettings)(lambda s: Hold(s))

class RecordLR(Callback):
    """Rank 0 writes, per batch, the learning rate its optimizer step runs at (lr-rank0.jsonl in ``folder``)."""

    def __init__(self, settings: RecordSamplesSettings):
        self.folder = settings.folder

    def on_batch_start(self, state: TrainState):
        if state.dist.rank == 0:
            with open(f"{self.folder}/lr-rank0.jsonl", "a") as f:
                lr = state.optimizer.param_groups[0]["lr"]
                f.write(json.dumps({"batch": state.time.batch + 1, "lr": float(lr)}) + "\n")


callbacks.register("record_lr", config=RecordSamplesSettings)(lambda s: RecordLR(s))


@dataclass
class EnvHashSettings:
    name: str = option("HF_TOKEN", "the environment variable whose SHA-256 rank 0 prints")


class PrintEnvHash(Callback):
    """Rank 0 prints ``<name> sha256 <hex>`` at the start of training: the job got the secret, and only its hash
    is shown."""

    def __init__(self, settings: EnvHashSettings):
        self.name = settings.name

    def on_fit_start(self, state: TrainState):
        if state.dist.rank == 0:
            digest = hashlib.sha256(os.environ.get(self.name, "").encode()).hexdigest()
            print(f"{self.name} sha256 {digest}", flush=True)


callbacks.register("print_env_hash", config=EnvHashSettings)(lambda s: PrintEnvHash(s))

if __name__ == "__main__":
    from llmfoundry.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
