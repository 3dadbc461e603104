"""Learning-rate schedules follow Composer: its formulas, its time conversion and its timing (the first value serves
two optimizer steps; step k >= 2 runs at the value after k - 2 batches), also across a resume."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.timeunits import Rates, Time
from llmfoundry.train import schedules
from llmfoundry.train.callbacks.base import Callback
from tests.helpers import make_trainer, weights

LR = 3e-3  # the tiny recipe's optimizer.lr
TOKENS, SAMPLES = 512, 8  # per batch in the tiny recipe (8 samples of 64 tokens)


class LRRecorder(Callback):
    """The learning rate each optimizer step runs at (read before the step, after the previous one)."""

    def __init__(self):
        self.lrs: list[float] = []

    def on_batch_start(self, trainer):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def run(recipe, **overrides):
    trainer = make_trainer(recipe(**{"eval_loader": None, "max_duration": "8ba"} | overrides))
    recorder = LRRecorder()
    trainer.callbacks.append(recorder)
    trainer.fit()
    return trainer, recorder.lrs


def composer_lrs(multiplier, steps: int = 8) -> list[float]:
    """Composer steps its scheduler after each batch but before its batch counter advances, and its schedules read
    that counter: optimizer step 1 runs at multiplier(0 batches trained), step k >= 2 at multiplier(k - 2)."""
    return [LR * multiplier(max(k - 2, 0)) for k in range(1, steps + 1)]


def cosine(x: float, alpha_f: float) -> float:
    return alpha_f + (1 - alpha_f) * (1 + math.cos(math.pi * x)) / 2


def inv_sqrt(b: int) -> float:  # t_warmup 2ba, t_scale 2ba, t_cooldown 3ba, t_max 8ba, decay to 0.2, cool to 0.05
    if b < 2:
        return b / 2
    at = lambda t: 0.2 + 0.8 / math.sqrt((t - 2 + 2) / 2)  # noqa: E731
    return at(b) if b < 5 else at(5) + (b - 5) / 3 * (0.05 - at(5))


CASES = {
    "cosine_with_warmup": ({"name": "cosine_with_warmup", "t_warmup": "2ba", "alpha_f": 0.1}, {},
                           lambda b: b / 2 if b < 2 else cosine((b - 2) / 6, 0.1)),
    "cosine_warmup_1ba": ({"name": "cosine_with_warmup", "t_warmup": "1ba"}, {},
                          lambda b: b / 1 if b < 1 else cosine((b - 1) / 7, 0.0)),
    "linear_decay_with_warmup": ({"name": "linear_decay_with_warmup", "t_warmup": "3ba", "t_max": "10ba",
                                  "alpha_i": 0.8, "alpha_f": 0.2}, {},
                                 lambda b: 0.8 * b / 3 if b < 3 else 0.8 + (b - 3) / 7 * (0.2 - 0.8)),
    "constant_with_warmup": ({"name": "constant_with_warmup", "t_warmup": "0.25dur", "alpha": 0.5}, {},
                             lambda b: 0.5 * b / 2 if b < 2 else 0.5),
    "inv_sqrt_with_warmup": ({"name": "inv_sqrt_with_warmup", "t_warmup": "2ba", "t_scale": "2ba",
                              "t_cooldown": "3ba", "alpha_f_decay": 0.2, "alpha_f_cooldown": 0.05}, {}, inv_sqrt),
    "warmup_in_tokens": ({"name": "cosine_with_warmup", "t_warmup": "1000tok", "scale_warmup": True},
                         {"max_duration": "4096tok"},
                         lambda b: TOKENS * b / 1000 if TOKENS * b < 1000 else cosine((TOKENS * b - 1000) / 3096, 0)),
    "warmup_in_samples": ({"name": "linear_decay_with_warmup", "t_warmup": "20sp", "t_max": "64sp"},
                          {"max_duration": "64sp"},
                          lambda b: SAMPLES * b / 20 if SAMPLES * b < 20 else 1 - (SAMPLES * b - 20) / 44),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_step_runs_at_the_learning_rate_composer_gives_it(recipe, case):
    scheduler, overrides, multiplier = CASES[case]
    _, lrs = run(recipe, scheduler=scheduler, **overrides)
    assert lrs == pytest.approx(composer_lrs(multiplier), rel=1e-12, abs=1e-15)
    assert lrs[0] == lrs[1]  # the first value serves two steps


def test_a_run_resumed_at_batch_4_continues_the_same_lr_sequence_and_weights(recipe, tmp_path):
    scheduler = CASES["cosine_with_warmup"][0]
    straight, lrs = run(recipe, scheduler=scheduler, save_folder=str(tmp_path / "a"), save_interval="4ba")
    resumed, resumed_lrs = run(recipe, scheduler=scheduler, load_path=str(tmp_path / "a" / "ep0-ba4"))
    assert resumed_lrs == lrs[4:]
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()
    expected, got = weights(straight), weights(resumed)
    for key in expected:
        assert (expected[key] == got[key]).all(), key


RATES = Rates(batches_per_epoch=10, samples_per_batch=8, tokens_per_batch=512, max_duration_batches=25,
              max_duration=Time(25, "ba"))


@pytest.mark.parametrize("text, rates, expected", [
    ("0.3dur", RATES, (7, "ba")),  # truncated like Composer's int(), not rounded up
    ("2ep", RATES, (20, "ba")),
    ("0.5dur", Rates(10, 8, 512, 30, Time(3, "ep")), (15, "ba")),  # max_duration in ep: dur becomes batches
    ("0.5dur", Rates(None, 8, 512, 8, Time(4096, "tok")), (2048, "tok")),  # ... otherwise max_duration's unit
    ("1000tok", RATES, (1000, "tok")),
    ("20sp", RATES, (20, "sp")),
])  # fmt: skip
def test_times_convert_as_composer_converts_them(text, rates, expected):
    span = schedules.convert(text, rates, "scheduler.t_warmup")
    assert (span.value, span.unit) == expected


def test_schedule_reads_tokens_and_samples_trained_not_batches():
    rates = Rates(None, 8, 512, 8, Time(4096, "tok"))
    multiplier = schedules.build_cosine(schedules.CosineSettings(t_warmup="1000tok"), rates)
    assert multiplier(SimpleNamespace(batch=1, sample=8, token=512)) == 0.512
    assert multiplier(SimpleNamespace(batch=2, sample=16, token=1024)) == pytest.approx(cosine(24 / 3096, 0.0))


@pytest.mark.parametrize("scheduler, overrides, message", [
    ({"name": "cosine_with_warmup", "t_warmup": "100tok"}, {},
     "scheduler.t_warmup: 100tok and t_max 8ba must be in the same unit"),
    ({"name": "linear_decay_with_warmup", "t_warmup": "1ba", "t_max": "6ba"}, {},
     "scheduler.t_max: 6ba must be at least max_duration (8ba)"),
    ({"name": "constant_with_warmup", "t_warmup": "1ba", "t_max": "0.5dur"}, {"max_duration": "2ep"},
     "scheduler.t_max: 11ba must be at least max_duration (2ep)"),
    ({"name": "inv_sqrt_with_warmup", "t_warmup": "0.1dur", "t_scale": "1ba", "t_cooldown": "0ba"}, {},
     "scheduler.t_warmup: cannot be in units of dur"),
    ({"name": "inv_sqrt_with_warmup", "t_warmup": "512tok", "t_scale": "1ba", "t_cooldown": "0ba"}, {},
     "scheduler.t_warmup: must be in max_duration's unit (ba)"),
    ({"name": "inv_sqrt_with_warmup", "t_warmup": "1ba", "t_scale": "1ba", "t_cooldown": "0ba",
      "alpha_f_cooldown": 0.5}, {}, "scheduler.alpha_f_cooldown: must be at most alpha_f_decay"),
    ({"name": "cosine_with_warmup", "t_warmup": "1.5ba"}, {}, "scheduler.t_warmup: '1.5ba' must be a whole number"),
])  # fmt: skip
def test_schedules_composer_would_refuse_are_one_line_errors(recipe, scheduler, overrides, message):
    with pytest.raises(ConfigError) as error:
        make_trainer(recipe(**{"eval_loader": None, "max_duration": "8ba", "scheduler": scheduler} | overrides))
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["cosine_with_warmup", "linear_decay_with_warmup", "constant_with_warmup"])
def test_t_warmup_is_required_as_in_composer(recipe, name):
    from llmfoundry.train.recipe import TrainConfig, validate

    with pytest.raises(ConfigError, match="scheduler.t_warmup"):
        validate(recipe(scheduler={"name": name}), TrainConfig)
