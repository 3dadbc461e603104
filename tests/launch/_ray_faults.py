"""code_paths file for the Ray tests: an `exit_once` callback that kills its rank's process abruptly
(``os._exit``) after a given batch, on the first attempt only (a marker file remembers that it happened)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmfoundry.config.fields import option
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainState


@dataclass
class ExitOnceSettings:
    marker: str = option("", "file created just before the exit; while it exists, nothing happens")
    rank: int = option(1, "the rank that exits")
    batch: int = option(6, "exit at the end of this batch")


class ExitOnce(Callback):
    def __init__(self, settings: ExitOnceSettings):
        self.settings = settings

    def on_batch_end(self, state: TrainState, metrics):
        s = self.settings
        if state.dist.rank == s.rank and state.time.batch == s.batch and not os.path.exists(s.marker):
            Path(s.marker).write_text(f"rank {s.rank} exited after batch {s.batch}\n")
            os._exit(1)


callbacks.register("exit_once", config=ExitOnceSettings)(lambda s: ExitOnce(s))


@dataclass
class WhereSettings:
    folder: str = option(".", "where node-rank{r}.txt goes")


class Where(Callback):
    """Writes the Ray node id of each rank's worker (node-rank{r}.txt), so a test knows which node to take away."""

    def __init__(self, settings: WhereSettings):
        self.folder = settings.folder

    def on_fit_start(self, state: TrainState):
        import ray

        Path(self.folder, f"node-rank{state.dist.rank}.txt").write_text(ray.get_runtime_context().get_node_id())


callbacks.register("where", config=WhereSettings)(lambda s: Where(s))


@dataclass
class RefuseSettings:
    reason: str = option("refused", "the ConfigError's text")


def _refuse(settings: RefuseSettings):
    """A callback whose construction (on the workers, never on the driver) is bad input: a ConfigError."""
    from llmfoundry.core.errors import ConfigError

    raise ConfigError(f"callbacks.refuse: {settings.reason}")


callbacks.register("refuse", config=RefuseSettings)(_refuse)
