"""Where a converter's time goes, by phase (``benchmarks/data_prep.py --profile``, ``--logging-level DEBUG``).

A converter adds the seconds of each phase (reading input, tokenizing, writing samples, flushing shards, merging
the index, ...) to a ``Phases``; worker processes send theirs back with their results, so a phase's seconds are
summed over the processes that ran it (on 2 workers, 2 s of tokenizing may take 1 s of wall time). The last run's
phases stay readable through ``last()``; the timers cost a ``perf_counter`` call per batch, not per document.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)
_last: dict[str, float] = {}


class Phases:
    """Seconds by phase name, in the order the phases were first seen."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def merge(self, seconds: dict[str, float]) -> None:
        for name, value in seconds.items():
            self.add(name, value)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def iterate(self, name: str, items: Iterable[Any]) -> Iterator[Any]:
        """``items``, with the time spent producing each one (reading a file, parsing a line) added to ``name``."""
        iterator = iter(items)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.add(name, time.perf_counter() - start)
                return
            self.add(name, time.perf_counter() - start)
            yield item


def publish(phases: Phases, what: str) -> None:
    """Keep ``phases`` as the last run's (``last()``) and log them at debug level."""
    global _last
    _last = dict(phases.seconds)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: time by phase (seconds, summed over processes): %s", what,
                  ", ".join(f"{name} {seconds:.3f}" for name, seconds in _last.items()))


def last() -> dict[str, float]:
    """Seconds by phase of the last converter run in this process."""
    return dict(_last)
