"""Training time strings: "100ba" (batches), "1ep" (epochs), "2000tok" (tokens), "10sp" (samples), "0.1dur".

Times in ba, ep and dur are converted to a number of batches once, up front, from the run's rates (batches per
epoch, samples and tokens per batch). Times in tok and sp are compared with what was trained, as Composer does:
training ends at the first batch whose token (sample) count reaches max_duration, and an eval or save interval in
tok or sp is due at each batch that passes a multiple of it. Tokens are the attention mask's (padding left out),
so on padded finetuning data a run in tok trains as many batches as llm-foundry's, not the nominal
``global batch size x max_seq_len`` per batch (which Rates uses only to estimate how many batches that will be).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

UNITS = {"ba": "batches", "ep": "epochs", "tok": "tokens", "sp": "samples", "dur": "fraction of max_duration"}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ba|ep|tok|sp|dur)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Time:
    value: float
    unit: str  # one of UNITS

    @classmethod
    def parse(cls, text: str | int) -> "Time":
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(float(text), "ep")  # a bare integer means epochs, as in llm-foundry recipes
        match = _PATTERN.match(str(text))
        if not match:
            units = ", ".join(f"{u} ({d})" for u, d in UNITS.items())
            raise ValueError(f"'{text}' is not a time: expected a number followed by a unit, one of {units}")
        return cls(float(match.group(1)), match.group(2).lower())


def check_time(text: str | int) -> None:
    """Schema check: raises ValueError with a readable message when ``text`` is not a time string."""
    Time.parse(text)


@dataclass(frozen=True)
class Rates:
    """How one batch relates to the other units; ``max_duration_batches`` resolves "dur".

    ``max_duration`` (as written, in its own unit) is for the schedules, which convert "dur" the way Composer does:
    to max_duration's unit, not to batches.
    """

    batches_per_epoch: int | None
    samples_per_batch: int
    tokens_per_batch: int
    max_duration_batches: int | None = None
    max_duration: Time | None = None

    def to_batches(self, time: str | int | Time, key: str = "time") -> int:
        """Whole batches (rounded up) for ``time``; ``key`` names the config key in errors."""
        t = time if isinstance(time, Time) else Time.parse(time)
        if t.unit == "ba":
            batches = t.value
        elif t.unit == "ep":
            if not self.batches_per_epoch:
                raise ValueError(f"{key}: '{t.value:g}ep' needs a dataset of known length; use a time in ba or tok")
            batches = t.value * self.batches_per_epoch
        elif t.unit == "sp":
            batches = t.value / self.samples_per_batch
        elif t.unit == "tok":
            batches = t.value / self.tokens_per_batch
        else:  # dur
            if self.max_duration_batches is None:
                raise ValueError(f"{key}: max_duration itself cannot be given in dur")
            batches = t.value * self.max_duration_batches
        return int(math.ceil(batches - 1e-9))


COUNTED = {"tok": "token", "sp": "sample"}  # units compared with the trainer's counters, not converted to batches


def counted(time: str | int | Time) -> Time | None:
    """``time`` when it is in tok or sp (compared with what was trained), else None (converted to batches)."""
    t = time if isinstance(time, Time) else Time.parse(time)
    return t if t.unit in COUNTED else None


def interval_due(every_batches: int, interval: Time | None, before, now) -> bool:
    """Whether an eval or save interval is due after the batch that took the trainer from ``before`` to ``now``
    (objects with batch, sample and token counters): every ``every_batches`` batches, or, for an ``interval`` in
    tok or sp, when a multiple of it lies in (before, now], as in Composer's interval scheduler."""
    if interval is None:
        return now.batch % every_batches == 0
    counter = COUNTED[interval.unit]
    return math.floor(getattr(before, counter) / interval.value) != math.floor(getattr(now, counter) / interval.value)


def estimated_last_batch(end: Time, now, nominal_per_batch: float) -> int:
    """The batch a max_duration in tok or sp ends at: ``now.batch`` once the count reaches it (Composer stops at
    the first batch that does), else an estimate that assumes the batches to come count as many as those so far
    on average (``nominal_per_batch`` before the first); always after ``now.batch`` until reached."""
    count = getattr(now, COUNTED[end.unit])
    if count >= end.value:
        return now.batch
    per_batch = count / now.batch if now.batch and count else nominal_per_batch
    return now.batch + max(1, math.ceil((end.value - count) / per_batch - 1e-9))


def counted_interval(interval: str | int | Time, max_duration: str | int | Time) -> Time | None:
    """How an eval or save ``interval`` is checked: a Time in tok or sp for ``interval_due``, or None (batches).

    A ``dur`` interval with max_duration in tok or sp never comes due on its own, as in Composer (whose ``dur``
    intervals follow only a max_duration in ba or ep): it is then due only at the end of training."""
    t = interval if isinstance(interval, Time) else Time.parse(interval)
    end = max_duration if isinstance(max_duration, Time) else Time.parse(max_duration)
    if t.unit == "dur" and end.unit in COUNTED:
        return Time(math.inf, end.unit)
    return counted(t)
