"""Learning-rate schedules by name, as multipliers of the peak learning rate, with Composer's arithmetic.

A schedule is a function of the trainer's time (``batch``, ``sample``, ``token``: what has been trained so far)
that returns the multiplier, exactly as Composer's schedulers compute it from ``state.timestamp``:

- times convert as Composer's ``_convert_time`` does: ``ep`` becomes batches, ``dur`` becomes the unit of
  ``max_duration`` (batches when max_duration is in epochs), and the count is truncated to a whole number;
  ``tok`` and ``sp`` stay tokens and samples and are compared with the tokens and samples trained so far;
- the checks Composer makes when a schedule is first used (t_warmup and t_max in the same unit, t_max not
  shorter than max_duration, ...) are made here when the schedule is built, as one-line errors.

When the multiplier is read is the trainer's business (``Trainer.train_step``): like Composer, it re-evaluates
the schedule after each optimizer step and before its time advances, so the first value is used by the first two
steps and optimizer step k >= 2 runs at the value for the time after k - 2 batches.

``scale_warmup`` is accepted for recipe compatibility: it only matters with Composer's ``scale_schedule_ratio``,
which llm-foundry never sets, so it changes nothing there and nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmfoundry.config.checks import NonNegativeFloat, TimeString
from llmfoundry.config.fields import option
from llmfoundry.core.timeunits import Rates, Time
from llmfoundry.registry import schedulers

_COUNTERS = {"ba": "batch", "sp": "sample", "tok": "token"}


class Now(Protocol):
    """The trainer's time: what has been trained so far (TrainTime has these)."""

    batch: int
    sample: int
    token: int


Multiplier = Callable[[Now], float]  # trained so far -> lr multiplier


@dataclass(frozen=True)
class Span:
    """A schedule time as Composer holds it once converted: a whole number of batches, samples or tokens."""

    value: int
    unit: str  # ba, sp or tok

    def elapsed(self, now: Now) -> int:
        """``now`` in this span's unit."""
        return getattr(now, _COUNTERS[self.unit])

    def __str__(self) -> str:
        return f"{self.value}{self.unit}"


def convert(text: str, rates: Rates, key: str) -> Span:
    """``text`` as Composer's scheduler converts it (``_convert_time`` with no scale_schedule_ratio)."""
    t = Time.parse(text)
    if t.unit != "dur" and t.value != int(t.value):
        raise ValueError(f"{key}: '{text}' must be a whole number of {t.unit} (Composer's rule; use dur for fractions)")
    if t.unit == "dur":
        limit = rates.max_duration
        if limit is None:
            raise ValueError(f"{key}: '{text}' needs max_duration")
        if limit.unit == "ep":
            return Span(int(t.value * _epoch_batches(rates, key) * limit.value), "ba")
        return Span(int(t.value * limit.value), limit.unit)
    if t.unit == "ep":
        return Span(int(t.value * _epoch_batches(rates, key)), "ba")
    return Span(int(t.value), t.unit)


def _epoch_batches(rates: Rates, key: str) -> int:
    if not rates.batches_per_epoch:
        raise ValueError(f"{key}: a time in ep or dur (with max_duration in ep) needs a dataset of known length")
    return rates.batches_per_epoch


def _same_unit(t_warmup: Span, t_max: Span) -> None:
    if t_warmup.unit != t_max.unit:
        raise ValueError(f"scheduler.t_warmup: {t_warmup} and t_max {t_max} must be in the same unit (Composer "
                         f"converts dur to max_duration's unit)")


def _covers_max_duration(t_max: Span, rates: Rates) -> None:
    """Composer's check that the schedule is defined for the whole run, where the units can be compared."""
    limit = rates.max_duration
    if limit is None:
        return
    if limit.unit == "ep" and rates.batches_per_epoch and t_max.unit == "ba":
        needed = limit.value * rates.batches_per_epoch
    elif limit.unit == t_max.unit:
        needed = limit.value
    else:
        return
    if t_max.value < needed:
        raise ValueError(f"scheduler.t_max: {t_max} must be at least max_duration ({limit.value:g}{limit.unit}), "
                         f"or the schedule ends before training does")


def _warmup(now: Now, t_warmup: Span, peak: float) -> float | None:
    """The linear warmup from 0 to ``peak``, or None once ``now`` has reached t_warmup."""
    elapsed = t_warmup.elapsed(now)
    if elapsed < t_warmup.value:
        return peak * min(1.0, elapsed / t_warmup.value)
    return None


def _decay_fraction(now: Now, t_warmup: Span, t_max: Span) -> float:
    """Fraction of the post-warmup time elapsed, clipped to at most 1 (0 when t_max is not after t_warmup)."""
    if t_max.value <= t_warmup.value:
        return 0.0
    return min(1.0, (t_warmup.elapsed(now) - t_warmup.value) / (t_max.value - t_warmup.value))


@dataclass
class CosineSettings:
    t_warmup: TimeString = option(doc="linear warmup length (required, as in Composer)")
    t_max: TimeString = option("1dur", "end of the cosine decay; at least max_duration")
    alpha_f: NonNegativeFloat = option(0.0, "final learning rate as a fraction of the peak")
    scale_warmup: bool = option(False, "Composer's scale_schedule_ratio option; no effect (llm-foundry sets no ratio)")


@dataclass
class LinearSettings:
    t_warmup: TimeString = option(doc="linear warmup length (required, as in Composer)")
    t_max: TimeString = option("1dur", "end of the linear decay; at least max_duration")
    alpha_i: NonNegativeFloat = option(1.0, "multiplier at the end of warmup")
    alpha_f: NonNegativeFloat = option(0.0, "final multiplier")
    scale_warmup: bool = option(False, "Composer's scale_schedule_ratio option; no effect (llm-foundry sets no ratio)")


@dataclass
class ConstantSettings:
    t_warmup: TimeString = option(doc="linear warmup length (required, as in Composer)")
    alpha: NonNegativeFloat = option(1.0, "multiplier after warmup")
    t_max: TimeString = option("1dur", "duration of the schedule; at least max_duration")
    scale_warmup: bool = option(False, "Composer's scale_schedule_ratio option; no effect (llm-foundry sets no ratio)")


@dataclass
class InvSqrtSettings:
    t_warmup: TimeString = option(doc="linear warmup length, in max_duration's unit (not dur)")
    t_scale: TimeString = option(doc="time scale of the 1/sqrt decay, in max_duration's unit (not dur)")
    t_cooldown: TimeString = option(doc="linear cooldown at the end of t_max, in max_duration's unit (not dur)")
    t_max: TimeString = option("1dur", "duration of the schedule")
    alpha_f_decay: NonNegativeFloat = option(0.0, "multiplier the 1/sqrt decay tends to at infinite time")
    alpha_f_cooldown: NonNegativeFloat = option(0.0, "multiplier the cooldown ends at (at most alpha_f_decay)")


def _warmup_and_max(settings, rates: Rates) -> tuple[Span, Span]:
    t_warmup = convert(settings.t_warmup, rates, "scheduler.t_warmup")
    t_max = convert(settings.t_max, rates, "scheduler.t_max")
    _same_unit(t_warmup, t_max)
    _covers_max_duration(t_max, rates)
    return t_warmup, t_max


@schedulers.register("cosine_with_warmup", config=CosineSettings)
def build_cosine(settings: CosineSettings, rates: Rates) -> Multiplier:
    t_warmup, t_max = _warmup_and_max(settings, rates)
    alpha_f = settings.alpha_f

    def multiplier(now: Now) -> float:
        w = _warmup(now, t_warmup, 1.0)
        if w is not None:
            return w
        x = max(0.0, _decay_fraction(now, t_warmup, t_max))
        return alpha_f + (1 - alpha_f) * (1 + math.cos(x * math.pi)) / 2

    return multiplier


@schedulers.register("linear_decay_with_warmup", config=LinearSettings)
def build_linear(settings: LinearSettings, rates: Rates) -> Multiplier:
    t_warmup, t_max = _warmup_and_max(settings, rates)
    alpha_i, alpha_f = settings.alpha_i, settings.alpha_f

    def multiplier(now: Now) -> float:
        w = _warmup(now, t_warmup, alpha_i)
        if w is not None:
            return w
        return alpha_i + _decay_fraction(now, t_warmup, t_max) * (alpha_f - alpha_i)

    return multiplier


@schedulers.register("constant_with_warmup", config=ConstantSettings)
def build_constant(settings: ConstantSettings, rates: Rates) -> Multiplier:
    t_warmup, _ = _warmup_and_max(settings, rates)
    alpha = settings.alpha

    def multiplier(now: Now) -> float:
        w = _warmup(now, t_warmup, alpha)
        return alpha if w is None else w

    return multiplier


@schedulers.register("inv_sqrt_with_warmup", config=InvSqrtSettings)
def build_inv_sqrt(settings: InvSqrtSettings, rates: Rates) -> Multiplier:
    """llm-foundry's InverseSquareRootWithWarmupScheduler: warmup, 1/sqrt decay, optional linear cooldown."""
    if settings.alpha_f_decay < settings.alpha_f_cooldown:
        raise ValueError(f"scheduler.alpha_f_cooldown: must be at most alpha_f_decay ({settings.alpha_f_decay}), "
                         f"got {settings.alpha_f_cooldown}")
    limit = rates.max_duration
    for key in ("t_warmup", "t_scale", "t_cooldown"):
        unit = Time.parse(getattr(settings, key)).unit
        if unit == "dur":
            raise ValueError(f"scheduler.{key}: cannot be in units of dur (use max_duration's unit)")
        if limit is not None and unit != limit.unit:
            raise ValueError(f"scheduler.{key}: must be in max_duration's unit ({limit.unit}), got "
                             f"'{getattr(settings, key)}'")
    t_warmup = convert(settings.t_warmup, rates, "scheduler.t_warmup")
    t_scale = convert(settings.t_scale, rates, "scheduler.t_scale")
    t_cooldown = convert(settings.t_cooldown, rates, "scheduler.t_cooldown")
    t_max = convert(settings.t_max, rates, "scheduler.t_max")
    if t_scale.value <= 0:
        raise ValueError(f"scheduler.t_scale: must be more than 0, got '{settings.t_scale}'")
    _same_unit(t_warmup, t_max)
    decay_to, cool_to = settings.alpha_f_decay, settings.alpha_f_cooldown
    cooldown_start = max(t_max.value - t_cooldown.value, t_warmup.value)

    shift = t_scale.value - t_warmup.value

    def decayed(elapsed: int) -> float:  # Composer's operation order, so the floats agree to the last bit
        coeff = 1 / ((elapsed + shift) / t_scale.value) ** 0.5
        return decay_to + coeff * (1.0 - decay_to)

    def multiplier(now: Now) -> float:
        w = _warmup(now, t_warmup, 1.0)
        if w is not None:
            return w
        elapsed = t_scale.elapsed(now)
        if elapsed < cooldown_start:
            return decayed(elapsed)
        at_start = decayed(cooldown_start)
        if t_cooldown.value == 0:
            return at_start
        frac = min(1.0, (elapsed - cooldown_start) / t_cooldown.value)
        return at_start + frac * (cool_to - at_start)

    return multiplier
