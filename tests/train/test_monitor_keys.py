"""Composer's keys and metrics of speed_monitor, runtime_estimator and memory_monitor, with a clock the test
drives: each batch takes 10 s and each evaluation 5 s, so every logged time and rate has one right value."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed
import torch.multiprocessing

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks import memory_monitor, runtime_estimator, speed_monitor
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.loggers.in_memory import InMemoryLogger
from tests.helpers import make_trainer

BATCH_SECONDS, EVAL_SECONDS = 10.0, 5.0


class Ticker(Callback):
    """Runs first: moves the monitors' clock on by a batch's or an evaluation's duration."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def on_batch_end(self, trainer, metrics):
        self.now += BATCH_SECONDS

    def on_eval_end(self, trainer, metrics):
        self.now += EVAL_SECONDS


def ticking_trainer(recipe, monkeypatch, **overrides):
    trainer = make_trainer(recipe(loggers={"inmemory": {}}, **overrides))
    ticker = Ticker()
    clock = SimpleNamespace(perf_counter=ticker.perf_counter)
    monkeypatch.setattr(speed_monitor, "time", clock)  # WallClock and SpeedMonitor
    monkeypatch.setattr(runtime_estimator, "time", clock)
    trainer.callbacks.insert(0, ticker)
    (logger,) = trainer.loggers
    assert isinstance(logger, InMemoryLogger)
    return trainer, logger


def values(logger: InMemoryLogger, key: str) -> dict[int, float]:
    return {when.batch: value for when, value in logger.data.get(key, [])}


def test_speed_monitor_windows_and_wall_clock_in_the_chosen_unit(recipe, monkeypatch):
    trainer, logger = ticking_trainer(recipe, monkeypatch, max_duration="4ba", eval_interval="2ba",
                                      callbacks={"speed_monitor": {"window_size": 2, "time_unit": "minutes",
                                                                   "gpu_flops_available": 1e6}})
    trainer.fit()
    # train time: 10 s a batch; val time: the evaluation after batch 2 (5 s); in minutes
    assert values(logger, "time/train") == pytest.approx({1: 10 / 60, 2: 20 / 60, 3: 30 / 60, 4: 40 / 60})
    assert values(logger, "time/val") == pytest.approx({1: 0, 2: 0, 3: 5 / 60, 4: 5 / 60})
    assert values(logger, "time/total") == pytest.approx({1: 10 / 60, 2: 20 / 60, 3: 35 / 60, 4: 45 / 60})
    # a window of 2 batches after the first: from batch 3 on, evaluation time left out
    assert sorted(values(logger, "throughput/batches_per_sec")) == [3, 4]
    assert values(logger, "throughput/batches_per_sec")[4] == pytest.approx(0.1)
    assert values(logger, "throughput/samples_per_sec")[4] == pytest.approx(0.8)  # 8 samples a batch
    assert values(logger, "throughput/tokens_per_sec")[4] == pytest.approx(8 * 64 / 10)
    flops = trainer.model.flops_per_token(64) * 8 * 64 / 10
    assert values(logger, "throughput/flops_per_sec")[4] == pytest.approx(flops)
    assert values(logger, "throughput/device/flops_per_sec")[4] == pytest.approx(flops)  # one rank
    assert values(logger, "throughput/device/mfu")[4] == pytest.approx(flops / 1e6)


def test_runtime_estimator_skips_warm_up_and_adds_the_evaluations_to_come(recipe, monkeypatch):
    trainer, logger = ticking_trainer(recipe, monkeypatch, max_duration="4ba", eval_interval="2ba",
                                      callbacks={"runtime_estimator": {"skip_batches": 1, "time_unit": "minutes"}})
    trainer.fit()
    estimate = values(logger, "time/remaining_estimate")
    assert sorted(estimate) == [2, 3, 4]  # batch 1 is skipped; the clock starts with batch 2
    assert estimate[2] == pytest.approx(20 / 60)  # 10 s a batch, 2 batches left
    # after batch 3: 10 s of training left, plus Composer's count of evaluations to come (one every quarter of
    # the run since the clock started: 3 in all, 1 done) at 5 s each
    assert estimate[3] == pytest.approx((10 + 2 * 5) / 60)
    assert logger.hyperparameters["time/remaining_estimate_unit"] == "minutes"


def test_memory_monitor_aggregates_over_ranks_on_composer_batches(recipe):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", loggers={"inmemory": {}}, callbacks={
        "memory_monitor": {"dist_aggregate_batch_interval": 2}}))
    trainer.fit()
    (logger,) = trainer.loggers
    assert sorted(values(logger, "memory/rss_mem")) == [1, 2, 3, 4]
    assert sorted(values(logger, "memory/rss_mem_max")) == [1, 3]  # Composer's batch indices 0 and 2
    one_rank = values(logger, "memory/peak_rss_mem")[3]
    for suffix in ("avg", "min", "max"):
        assert values(logger, f"memory/peak_rss_mem_{suffix}")[3] == one_rank


def test_memory_report_names_and_units_follow_composer():
    stats = {"allocated_bytes.all.current": 1_234_567_890, "reserved_bytes.all.peak": 2e9, "num_alloc_retries": 3,
             "active_bytes.all.peak": 0}
    assert memory_monitor.cuda_memory_report(stats, memory_monitor.DEFAULT_MEMORY_KEYS) == {
        "current_allocated_mem": 1.2346, "peak_reserved_mem": 2.0, "alloc_retries": 3.0, "peak_active_mem": 0.0}
    custom = {"allocated_bytes.all.current": "allocated_bytes", "not_a_stat": "x"}
    assert memory_monitor.cuda_memory_report(stats, custom) == {"allocated_gigabytes": 1.2346}


def _aggregate_on_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        report = memory_monitor.aggregate_over_ranks({"used": 1.0 + 2 * rank, "peak": 5.0}, torch.device("cpu"))
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.dist
def test_memory_aggregation_gives_every_rank_the_mean_min_and_max(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_aggregate_on_rank, args=(port, str(tmp_path)), nprocs=2,
                                          start_method="fork")
    expected = {"used_avg": 2.0, "used_min": 1.0, "used_max": 3.0, "peak_avg": 5.0, "peak_min": 5.0,
                "peak_max": 5.0}
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected


@pytest.mark.parametrize("callback, settings, message", [
    ("speed_monitor", {"time_unit": "weeks"}, "callbacks.speed_monitor.time_unit"),
    ("speed_monitor", {"window_size": 0}, "callbacks.speed_monitor.window_size: must be at least 1"),
    ("runtime_estimator", {"time_unit": "ms"}, "callbacks.runtime_estimator.time_unit"),
    ("runtime_estimator", {"skip_batches": -1}, "callbacks.runtime_estimator.skip_batches: must be >= 0"),
    ("memory_monitor", {"dist_aggregate_batch_interval": 0},
     "callbacks.memory_monitor.dist_aggregate_batch_interval: must be at least 1"),
])
def test_bad_monitor_settings_are_one_line_errors(recipe, callback, settings, message):
    with pytest.raises(ConfigError, match=message):
        make_trainer(recipe(callbacks={callback: settings}))
