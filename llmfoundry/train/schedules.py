"""Learning-rate schedules by name, as multipliers of the peak learning rate over batches.

Times (t_warmup, t_max, ...) are time strings, checked when the recipe is validated and converted to batches
by the trainer (see core/timeunits.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from llmfoundry.config.checks import NonNegativeFloat, TimeString
from llmfoundry.config.fields import option
from llmfoundry.core.timeunits import Rates
from llmfoundry.registry import schedulers

Multiplier = Callable[[int], float]  # batch index -> lr multiplier


@dataclass
class CosineSettings:
    t_warmup: TimeString = option("0ba", "linear warmup length")
    t_max: TimeString = option("1dur", "end of the cosine decay")
    alpha_f: NonNegativeFloat = option(0.0, "final learning rate as a fraction of the peak")


@dataclass
class LinearSettings:
    t_warmup: TimeString = option("0ba", "linear warmup length")
    t_max: TimeString = option("1dur", "end of the linear decay")
    alpha_i: NonNegativeFloat = option(1.0, "multiplier at the end of warmup")
    alpha_f: NonNegativeFloat = option(0.0, "final multiplier")


@dataclass
class ConstantSettings:
    t_warmup: TimeString = option("0ba", "linear warmup length")
    alpha: NonNegativeFloat = option(1.0, "multiplier after warmup")


@dataclass
class InvSqrtSettings:
    t_warmup: TimeString = option("0ba", "linear warmup length")
    t_scale: TimeString = option("1ba", "time scale of the 1/sqrt decay after warmup")
    t_cooldown: TimeString = option("0ba", "linear cooldown to alpha_f at the end of training")
    alpha_f: NonNegativeFloat = option(0.0, "final multiplier after cooldown")


def _warmup(step: int, warmup: int) -> float | None:
    if warmup > 0 and step < warmup:
        return step / warmup
    return None


@schedulers.register("cosine_with_warmup", config=CosineSettings)
def build_cosine(settings: CosineSettings, rates: Rates) -> Multiplier:
    warmup = rates.to_batches(settings.t_warmup, "scheduler.t_warmup")
    t_max = rates.to_batches(settings.t_max, "scheduler.t_max")

    def multiplier(step: int) -> float:
        w = _warmup(step, warmup)
        if w is not None:
            return w
        frac = min(1.0, (step - warmup) / max(1, t_max - warmup))
        return settings.alpha_f + (1 - settings.alpha_f) * 0.5 * (1 + math.cos(math.pi * frac))

    return multiplier


@schedulers.register("linear_decay_with_warmup", config=LinearSettings)
def build_linear(settings: LinearSettings, rates: Rates) -> Multiplier:
    warmup = rates.to_batches(settings.t_warmup, "scheduler.t_warmup")
    t_max = rates.to_batches(settings.t_max, "scheduler.t_max")

    def multiplier(step: int) -> float:
        w = _warmup(step, warmup)
        if w is not None:
            return w * settings.alpha_i
        frac = min(1.0, (step - warmup) / max(1, t_max - warmup))
        return settings.alpha_i + (settings.alpha_f - settings.alpha_i) * frac

    return multiplier


@schedulers.register("constant_with_warmup", config=ConstantSettings)
def build_constant(settings: ConstantSettings, rates: Rates) -> Multiplier:
    warmup = rates.to_batches(settings.t_warmup, "scheduler.t_warmup")

    def multiplier(step: int) -> float:
        w = _warmup(step, warmup)
        return w * settings.alpha if w is not None else settings.alpha

    return multiplier


@schedulers.register("inv_sqrt_with_warmup", config=InvSqrtSettings)
def build_inv_sqrt(settings: InvSqrtSettings, rates: Rates) -> Multiplier:
    warmup = rates.to_batches(settings.t_warmup, "scheduler.t_warmup")
    scale = max(1, rates.to_batches(settings.t_scale, "scheduler.t_scale"))
    cooldown = rates.to_batches(settings.t_cooldown, "scheduler.t_cooldown")
    total = rates.max_duration_batches or 0

    def multiplier(step: int) -> float:
        w = _warmup(step, warmup)
        if w is not None:
            return w
        value = 1.0 / math.sqrt(1 + (step - warmup) / scale)
        if cooldown > 0 and step >= total - cooldown:
            at_start = 1.0 / math.sqrt(1 + (total - cooldown - warmup) / scale)
            frac = (step - (total - cooldown)) / cooldown
            value = at_start + (settings.alpha_f - at_start) * frac
        return value

    return multiplier
