"""The ``optimizer`` section of each optimizer in train/optim.py, kept apart from torch so that checking a recipe
imports neither (train/catalog.py pairs each name with its settings)."""

from __future__ import annotations

from dataclasses import dataclass

from llmfoundry.config.checks import Betas, NonNegativeFloat, PositiveFloat, PositiveInt
from llmfoundry.config.fields import option


@dataclass
class ParamGroup:
    param_str_match: str = option(doc="regular expression; parameters whose names match join this group")
    lr: NonNegativeFloat | None = option(None, "learning rate of the group (default: the optimizer's)")
    weight_decay: NonNegativeFloat | None = option(None, "weight decay of the group (default: the optimizer's)")


@dataclass
class AdamSettings:
    lr: NonNegativeFloat = option(1e-4, "peak learning rate")
    betas: Betas = option([0.9, 0.95], "Adam beta1, beta2")
    eps: PositiveFloat = option(1e-8, "Adam epsilon")
    weight_decay: NonNegativeFloat = option(0.0, "weight decay")
    param_groups: list[ParamGroup] = option(default_factory=list, doc="per-parameter-name overrides")
    disable_grad: str | list[str] | None = option(None, "regex (or list): matching parameters are frozen")


@dataclass
class DecoupledAdamSettings(AdamSettings):
    """Composer's DecoupledAdamW defaults (lr 1e-3, weight_decay 1e-5)."""

    lr: NonNegativeFloat = option(1e-3, "peak learning rate")
    weight_decay: NonNegativeFloat = option(1e-5, "decoupled weight decay: weights shrink by wd * lr_t / lr_0 a step")
    amsgrad: bool = option(False, "AMSGrad: divide by the running maximum of the second moment")


@dataclass
class TorchAdamSettings(AdamSettings):
    amsgrad: bool = option(False, "AMSGrad: divide by the running maximum of the second moment")


@dataclass
class LionSettings:
    lr: NonNegativeFloat = option(1e-4, "peak learning rate")
    betas: Betas = option([0.9, 0.99], "Lion beta1 (update interpolation), beta2 (momentum decay)")
    weight_decay: NonNegativeFloat = option(0.0, "decoupled weight decay")
    param_groups: list[ParamGroup] = option(default_factory=list, doc="per-parameter-name overrides")
    disable_grad: str | list[str] | None = option(None, "regex (or list): matching parameters are frozen")


@dataclass
class ClipLionSettings(LionSettings):
    outlier_threshold: PositiveFloat = option(5.0, "a gradient norm above this times the delayed mean is clipped to it")


@dataclass
class AdaLRLionSettings(LionSettings):
    outlier_threshold: PositiveFloat = option(10.0, "a momentum norm above this times the delayed mean is an outlier")
    timeout: PositiveInt = option(100, "steps an outlier keeps lowering the learning rate")
    lr_penalty: PositiveFloat = option(0.707, "lr multiplier per outlier of the last `timeout` steps")
    min_scale: PositiveFloat = option(1e-4, "the lr is never scaled below this fraction")


@dataclass
class NoOpSettings:
    """no_op takes no keys."""
