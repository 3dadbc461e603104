"""Value types with a range or format check, for config fields: ``lr: NonNegativeFloat = option(1e-4, "...")``.

Each is an ``Annotated`` type whose ``Check`` the schema validator runs after type conversion, so a bad value is
reported with its key path together with every other problem, before anything is built.
"""

from __future__ import annotations

from typing import Annotated

from llmfoundry.config.validate import Check
from llmfoundry.core.timeunits import check_time

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _positive(value: float) -> None:
    if value <= 0:
        raise ValueError(f"must be positive, got {value}")


def _non_negative(value: float) -> None:
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")


def _probability(value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"must be in [0, 1), got {value}")


def _betas(value: list[float]) -> None:
    if len(value) != 2 or not all(0 <= b < 1 for b in value):
        raise ValueError(f"expected two numbers in [0, 1) (beta1, beta2), got {value}")


def _log_level(value: str) -> None:
    if value.lower() not in LOG_LEVELS:
        raise ValueError(f"'{value}' is not one of {', '.join(LOG_LEVELS)}")


PositiveInt = Annotated[int, Check(_positive)]
PositiveFloat = Annotated[float, Check(_positive)]
NonNegativeFloat = Annotated[float, Check(_non_negative)]
Probability = Annotated[float, Check(_probability)]
Betas = Annotated[list[float], Check(_betas)]
LogLevel = Annotated[str, Check(_log_level)]
TimeString = Annotated[str, Check(check_time)]  # "100ba", "1ep", "2000tok", "10sp", "0.1dur"
