"""A validated training recipe run to its end in this process: the heavy half of ``llmfoundry train`` (torch, the
model and data stacks), which commands/train.py loads only once the recipe has been checked."""

from __future__ import annotations

import sys

from llmfoundry.core import dist
from llmfoundry.train.errors import TrainingStopped
from llmfoundry.train.recipe import TrainConfig
from llmfoundry.train.trainer import Trainer


def run_training(cfg: TrainConfig, plain: dict) -> int:
    """Train ``cfg`` (``plain`` is the resolved recipe it came from); the command's exit code."""
    try:
        Trainer(cfg, plain).fit()
    except TrainingStopped as error:
        print(f"training stopped: {error}", file=sys.stderr)
        return 3
    except RuntimeError as error:  # FSDP's, DDP's and DCP's own collectives: bounded by dist_timeout too
        if dist.is_collective_failure(error):
            what = "a collective inside training (gradient sync, FSDP, checkpoint)"
            raise dist.collective_failure(what, error) from None
        raise
    finally:
        dist.destroy()
    return 0
