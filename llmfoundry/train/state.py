"""The state of a run that callbacks and checkpoints share.

``TrainState`` is what every callback hook receives (the trainer's, and ``llmfoundry eval``'s for its eval hooks).
A callback reads its fields and changes the run only through its methods: ``request_stop``, ``print``, ``save``,
``save_now``, ``finish_uploads``, ``restore`` and ``flush_metrics``. The trainer owns the object, advances ``time``,
sets ``batch`` and ``metrics`` at every step, and answers the requests through the :class:`RunServices` it passes in.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm

if TYPE_CHECKING:
    import torch

    from llmfoundry.core.dist import DataShare, DistInfo
    from llmfoundry.core.timeunits import Rates


@dataclass
class TrainTime:
    """How far training has come; saved in checkpoints."""

    epoch: int = 0
    batch: int = 0
    batch_in_epoch: int = 0
    sample: int = 0
    token: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {f"time/{k}": float(v) for k, v in vars(self).items()}

    def state_dict(self) -> dict[str, int]:
        return vars(self).copy()

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, value in vars(TrainTime(**state)).items():
            setattr(self, key, value)


@dataclass
class EvalHistory:
    losses: list[tuple[int, float]] = field(default_factory=list)  # (batch, eval loss)


class RunServices(Protocol):
    """What the run does when a callback asks (the trainer implements it)."""

    def save(self) -> str:
        """Write a checkpoint of this batch now (every rank calls it); returns its path or URL."""

    def save_now(self) -> None:
        """A launcher's just-in-time checkpoint on a preemption notice: this batch saved and the uploads so far
        finished, unless the trainer saves this batch anyway (already saved, save_interval due, or the last
        batch), in which case that save is left to the trainer and is not waited for here."""

    def finish_uploads(self) -> bool:
        """Wait (up to checkpoint_upload.wait_at_end_s) for checkpoint uploads; False if one did not complete."""

    def restore(self, load_path: str, weights_only: bool, strict: bool, ignore_keys: list[str] | None) -> None:
        """Load a checkpoint (ours or Composer's; a local path or a URL) into the run."""

    def flush_metrics(self) -> None:
        """Hand the loggers the metrics of the batches since the last log interval now."""


@dataclass(kw_only=True, eq=False)
class TrainState:
    """The run as callbacks see it. Fields are for reading; the methods are how a callback acts on the run."""

    # -- the run, fixed once it starts --
    run_name: str
    dist: DistInfo  # rank, world_size, is_main, device
    precision: str  # the precision the run trains in (after falling back where the device lacks it)
    data_share: DataShare  # this rank's share of the data (tensor-parallel ranks share one)
    model: torch.nn.Module | None = None  # the model (sharded in place under FSDP); CausalLM's members
    tokenizer: Any = None
    loggers: list = field(default_factory=list)  # rank 0's; other ranks have none
    optimizer: torch.optim.Optimizer | None = None
    optimizer_name: str = ""  # the recipe's optimizer.name
    scheduler: Any = None  # the LambdaLR over the recipe's schedule
    rates: Rates | None = None  # batches per epoch and per max_duration; rates.to_batches(...) for an interval
    eval_loaders: list = field(default_factory=list)  # (metric prefix, loader)
    icl_evaluator: Any = None  # eval.runner.ICLEvaluator when the run has icl_tasks (its .runs after evaluating)
    model_section: Any = None  # the recipe's model section (for another copy of the model: hf_checkpointer)
    save_folder: str | None = None
    checkpoint_upload: Any = None  # the recipe's checkpoint_upload settings (retries, staging, wait_at_end_s)
    preemption: Any = None  # train.preemption.Preemption: .signalled, .check_interval
    log_to_console: bool = True
    # -- what changes as it runs --
    time: TrainTime = field(default_factory=TrainTime)  # advanced by the trainer after each optimizer step
    batch: dict[str, torch.Tensor] | None = None  # the device batch being trained on
    # the step's metrics so far (what the hooks extend): device tensors and train.step_metrics.Derived values stay
    # unread until a log interval; float(value) reads one now (a device sync: only where a callback must decide)
    metrics: dict[str, Any] = field(default_factory=dict)
    # this batch's sums over ranks of the trainer's and the callbacks' host numbers (Callback.host_numbers), by name
    host_sums: dict[str, float] = field(default_factory=dict)
    restored_from: str | None = None  # the checkpoint the run started from
    _services: RunServices | None = field(default=None, repr=False)  # the trainer; callbacks use the methods
    _end: int = field(default=0, repr=False)
    _stop: tuple[int, str] | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def max_batches(self) -> int:
        """The batch training ends after: max_duration's (estimated for tok / sp), or where a stop was requested."""
        return min(self._end, self._stop[0]) if self._stop is not None else self._end

    @property
    def stop_reason(self) -> str | None:
        return self._stop[1] if self._stop is not None else None

    def end_at(self, batches: int) -> None:
        """The trainer's: where max_duration ends (re-estimated after every batch when it is in tok or sp)."""
        self._end = batches

    def request_stop(self, reason: str) -> None:
        """End training after the current batch, as Composer's ``state.stop_training()``: the run ends as at
        max_duration (a final evaluation, a checkpoint when save_folder is set, the fit_end hooks). Every rank must
        call it at the same batch (callbacks decide on global values)."""
        if self.max_batches > self.time.batch:
            self._stop = (self.time.batch, reason)
            self.print(f"stopping training at batch {self.time.batch}: {reason}")

    def print(self, message: str) -> None:
        """One line on rank 0's console (above the progress bar), unless log_to_console is off."""
        if self.dist.is_main and self.log_to_console:
            tqdm.write(message, file=sys.stdout)
            sys.stdout.flush()

    def save(self) -> str:
        return self._run().save()

    def save_now(self) -> None:
        self._run().save_now()

    def finish_uploads(self) -> bool:
        return self._run().finish_uploads()

    def restore(self, load_path: str, weights_only: bool = False, strict: bool = True,
                ignore_keys: list[str] | None = None) -> None:
        self._run().restore(load_path, weights_only, strict, ignore_keys)

    def flush_metrics(self) -> None:
        """Log the metrics of the batches since the last log interval now (before logging something else at this
        step, e.g. a table, so that loggers see steps in order); nothing to do outside training."""
        if self._services is not None:
            self._services.flush_metrics()

    def _run(self) -> RunServices:
        if self._services is None:
            raise RuntimeError("this run does not train (llmfoundry eval): it cannot save or restore checkpoints")
        return self._services
