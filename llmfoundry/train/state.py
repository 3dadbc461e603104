"""The state of a run that callbacks and checkpoints share: how far training has come, the eval losses so far."""

from __future__ import annotations

from dataclasses import dataclass, field


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
