"""run_timeout (llm-foundry's RunTimeoutCallback): a watchdog for a run that hangs after training.

At the end of training a timer starts; if the process is still alive ``timeout`` seconds later (stuck in a final
upload, a collective or a logger's shutdown), it interrupts itself with SIGINT so that a scheduler sees the run end
instead of holding the nodes. It does not limit how long training runs (nor does llm-foundry's): for that, set
max_duration.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import RunTimeoutSettings
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)


class RunTimeout(Callback):
    def __init__(self, settings: RunTimeoutSettings):
        self.timeout = settings.timeout
        self.timer: threading.Timer | None = None

    def on_fit_end(self, state: TrainState):
        if self.timer is not None:
            self.timer.cancel()
        # a daemon thread: a process that exits normally does not wait for it
        self.timer = threading.Timer(self.timeout, self._interrupt)
        self.timer.daemon = True
        self.timer.start()

    def _interrupt(self) -> None:
        log.error("run_timeout: still running %d seconds after training ended; interrupting the process",
                  self.timeout)
        os.kill(os.getpid(), signal.SIGINT)


def build_run_timeout(settings: RunTimeoutSettings) -> Callback:
    return RunTimeout(settings)
