"""A 2-rank job in which rank 1 never reaches the collective that rank 0 waits in (it sleeps instead), run as
``llmfoundry`` runs a command: rank 0 must fail within the process group's timeout with one line naming itself
and the operation. argv: timeout seconds, operation (barrier | broadcast | all_reduce)."""

import os
import sys
import time
from pathlib import Path

import torch

from llmfoundry.cli import run_main
from llmfoundry.core import dist


def both_ranks_started(rank: int, deadline_s: float = 120.0) -> None:
    """The group's timeout also bounds joining it: on a busy machine one rank may finish its imports seconds after
    the other, so the ranks meet here (files in the working folder) before they join a group with a 3 s limit."""
    Path(f"started-{rank}").touch()
    deadline = time.monotonic() + deadline_s
    while not all(Path(f"started-{r}").exists() for r in (0, 1)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other rank did not start")
        time.sleep(0.05)


def main(argv):
    timeout_s, op = float(argv[0]), argv[1]
    both_ranks_started(int(os.environ["RANK"]))
    info = dist.init_distributed(timeout_s)
    if info.rank == 1:
        time.sleep(600)  # stuck before the collective; torchrun ends this process when rank 0 fails
    started = time.monotonic()
    try:
        if op == "barrier":
            dist.barrier("checkpoint save")
        elif op == "broadcast":
            dist.broadcast_object({"step": 1})
        else:
            dist.all_reduce_sum(torch.ones(1))
    finally:
        print(f"rank 0 waited {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
