"""Stopping cleanly when the scheduler wants the machines back: save, then exit with a code that says why.

Four things ask for a stop: SIGTERM (a cancel, or Kubernetes evicting the pod), the recipe's preemption_signal
(SIGUSR2 by default: Slurm's ``--signal`` ahead of the time limit), a flag file (``$LLMFOUNDRY_PREEMPT_FILE``,
which the Slurm batch script creates when *it* receives the signal, so torchrun never sees one it does not
handle), and a wall-clock deadline (``exit_before_walltime`` before the job's end time). Any of them only sets a
flag; every ``preemption_check_interval`` batches the ranks agree on it with one all-reduce, so all of them stop
after the same batch. Then the newest state is saved synchronously (an upload in flight is finished first and the
checkpoint is marked complete) and the process exits: ``REQUEUE_EXIT_CODE`` (run me again) or 143 (SIGTERM:
cancelled, do not requeue). Rank 0 also writes the code to ``$LLMFOUNDRY_EXIT_FILE``, because torchrun reports
any failed worker as 1.

Handlers are installed only on the main thread (Ray Train runs training in a thread: none there), when the training
loop starts, and put back when it ends; in a forked data loader worker the handler restores the default action and
re-raises, so workers die as they always did.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path


from llmfoundry.core import dist
from llmfoundry.core.notices import notice_once
from llmfoundry.train.host_sums import host_sums
from llmfoundry.train.preemption_protocol import (
    CANCEL_EXIT_CODE,
    EXIT_FILE_ENV,
    FLAG_FILE_ENV,
    REQUEUE_EXIT_CODE,
    job_end_time,
    parse_wallclock,
    signal_number,
)

log = logging.getLogger(__name__)

class Preemption:
    """The stop flag: set by signals, the flag file or the deadline; agreed on by all ranks."""

    def __init__(self, signal_name: str | None, check_interval: int, exit_before_walltime=None, environ=None):
        environ = os.environ if environ is None else environ
        self.check_interval = max(1, int(check_interval))
        self.requeue_signal = signal_number(signal_name) if signal_name else None
        self.flag_file = environ.get(FLAG_FILE_ENV) or None
        self.exit_file = environ.get(EXIT_FILE_ENV) or None
        self.deadline: float | None = None
        if exit_before_walltime is not None:
            end = job_end_time(environ)
            if end is None:
                notice_once("exit_before_walltime: the job's end time is unknown (no SLURM_JOB_END_TIME or "
                            "LLMFOUNDRY_JOB_END_TIME), so no deadline is watched")
            else:
                self.deadline = end - parse_wallclock(exit_before_walltime)
        self.signalled: str | None = None  # 'requeue' or 'cancel', set by a handler
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    # ----- signal handlers -----
    def install(self) -> None:
        """Install the handlers (main thread only: Python allows no other; elsewhere the flag file and the
        deadline still work)."""
        if self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            # Ray Train runs the training function in a thread; Ray's own preemption notice (launch/ray.py) and
            # the flag file stand in for the signals there.
            log.info("preemption: no signal handlers off the main thread (the flag file and deadline still work)")
            return
        wanted = {int(signal.SIGTERM)} | ({self.requeue_signal} if self.requeue_signal else set())
        for number in wanted:
            self._previous[number] = signal.signal(number, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def _handle(self, number: int, _frame) -> None:
        if os.getpid() != self._pid:  # a forked data loader worker: behave as if we were never here
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        reason = "cancel" if number == signal.SIGTERM else "requeue"
        if self.signalled != "cancel":  # a cancel is never downgraded to a requeue
            self.signalled = reason

    # ----- the agreed flag -----
    def local_reason(self) -> str | None:
        if self.signalled:
            return self.signalled
        if self.flag_file and os.path.exists(self.flag_file):
            return "requeue"
        if self.deadline is not None and time.time() >= self.deadline:
            return "requeue"
        return None

    def should_stop(self, step: int) -> str | None:
        """'requeue', 'cancel' or None, the same on every rank; collective every check_interval batches."""
        if step % self.check_interval:
            return None
        reason = self.local_reason()
        # summed on the host (a gloo group beside NCCL): no device sync, and a process group made by someone else
        # with NCCL alone (Ray Train's, even for one worker) has no CPU backend for a CPU tensor
        requeue, cancel = host_sums([int(reason == "requeue"), int(reason == "cancel")])
        return "cancel" if cancel > 0 else "requeue" if requeue > 0 else None

    def exit_code(self, reason: str) -> int:
        return CANCEL_EXIT_CODE if reason == "cancel" else REQUEUE_EXIT_CODE


def save_now(trainer, saved: bool) -> None:
    """The newest state safely stored: save (unless this batch was just saved) and wait for every upload, so the
    checkpoint is complete. Also a launcher's just-in-time checkpoint on a preemption notice (Ray's)."""
    if trainer.cfg.save_folder and not saved:
        trainer.save()
    elif not trainer.cfg.save_folder:
        log.warning("preemption without a save_folder: batches since the start are lost")
    uploaded = trainer.finish_uploads()
    if not uploaded:
        log.error("some checkpoint uploads to %s did not complete before the preemption", trainer.cfg.save_folder)


def stop_for_preemption(trainer, reason: str, saved: bool) -> None:
    """Save (unless this batch was just saved), wait for every upload, close the loggers and exit the process."""
    preemption = trainer.preemption
    code = preemption.exit_code(reason)
    save_now(trainer, saved)
    trainer.state.print(f"preempted ({reason}) after batch {trainer.time.batch}: checkpoint saved, exiting with {code}")
    trainer.flush_metrics()  # the batches trained since the last log interval, before the loggers close
    for logger in trainer.loggers:
        logger.close()
    preemption.uninstall()
    if trainer.dist.is_main and preemption.exit_file:  # before the barrier: once one rank exits, torchrun
        Path(preemption.exit_file).parent.mkdir(parents=True, exist_ok=True)  # stops the others
        Path(preemption.exit_file).write_text(f"{code}\n")
    dist.barrier()  # everything is on disk on every rank before any of them exits
    dist.destroy()
    raise SystemExit(code)
