"""Training time strings: "100ba" (batches), "1ep" (epochs), "2000tok" (tokens), "10sp" (samples), "0.1dur".

Everything the trainer schedules (max_duration, eval/save intervals, warmup) is converted to a number of batches
once, up front, from the run's rates (batches per epoch, samples and tokens per batch). Token and sample counts
use the nominal batch shape (global batch size x max_seq_len), which is exact for pretraining and an upper bound
per batch for padded finetuning data.
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
