"""Preemption: a signal, the flag file or the deadline stops training at an agreed batch with a checkpoint and an
exit code that says requeue (75) or cancelled (143); a resumed run ends bitwise where an uninterrupted one does."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.checkpoint import latest_checkpoint
from llmfoundry.train.preemption import Preemption
from llmfoundry.train.preemption_protocol import CANCEL_EXIT_CODE, REQUEUE_EXIT_CODE, parse_wallclock, signal_number
from llmfoundry.train.recipe import TrainConfig, validate
from tests.distributed.helpers import (
    checkpoint_weights,
    descendants,
    launch,
    losses,
    run_job,
    torchrun_args,
)
from tests.helpers import make_trainer, tiny_recipe, weights
from tests.launch.launch_helpers import rank_processes


def test_wallclock_durations_and_signal_names():
    assert parse_wallclock("10m") == 600 and parse_wallclock(300) == 300 and parse_wallclock("1.5h") == 5400
    for bad in ("ten minutes", "0s", -5):
        with pytest.raises(ValueError):
            parse_wallclock(bad)
    assert signal_number("USR2") == signal_number("SIGUSR2") == signal.SIGUSR2
    with pytest.raises(ValueError):
        signal_number("SIGNOPE")


def test_bad_preemption_keys_are_one_line_errors(mds_root, tokenizer_dir):
    recipe = tiny_recipe(mds_root, tokenizer_dir, preemption_signal="SIGNOPE", exit_before_walltime="soon")
    with pytest.raises(ConfigError) as error:
        validate(recipe, TrainConfig)
    assert "preemption_signal" in str(error.value) and "exit_before_walltime" in str(error.value)


def test_signals_set_the_flag_and_the_handlers_are_put_back():
    before = signal.getsignal(signal.SIGUSR2)
    watcher = Preemption("SIGUSR2", 1, environ={})
    watcher.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert watcher.local_reason() == "requeue"
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.local_reason() == "cancel"
        os.kill(os.getpid(), signal.SIGUSR2)
        assert watcher.local_reason() == "cancel"  # a cancel is never downgraded
        assert watcher.should_stop(3) == "cancel" and watcher.exit_code("cancel") == CANCEL_EXIT_CODE
    finally:
        watcher.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is before


def test_no_handlers_off_the_main_thread():
    watcher = Preemption("SIGUSR2", 1, environ={})
    before = signal.getsignal(signal.SIGUSR2)
    thread = threading.Thread(target=watcher.install)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGUSR2) is before


def _child_signals_itself():
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(5)


def test_a_forked_worker_keeps_the_default_action():
    """Data loader workers are forked from the trainer: the inherited handler must not keep them alive."""
    watcher = Preemption("SIGUSR2", 1, environ={})
    watcher.install()
    try:
        child = multiprocessing.get_context("fork").Process(target=_child_signals_itself)
        child.start()
        child.join(10)
        assert child.exitcode == -signal.SIGUSR2
        assert watcher.local_reason() is None
    finally:
        watcher.uninstall()


def test_flag_file_and_deadline(tmp_path):
    flag = tmp_path / "preempt"
    watcher = Preemption(None, 2, environ={"LLMFOUNDRY_PREEMPT_FILE": str(flag)})
    assert watcher.should_stop(2) is None
    flag.touch()
    assert watcher.should_stop(3) is None  # only every check_interval batches
    assert watcher.should_stop(4) == "requeue"
    soon = {"LLMFOUNDRY_JOB_END_TIME": str(int(time.time()) + 60)}
    assert Preemption(None, 1, "2m", environ=soon).local_reason() == "requeue"
    assert Preemption(None, 1, "10s", environ=soon).local_reason() is None
    assert Preemption(None, 1, "10s", environ={}).deadline is None  # no end time known: a notice, no deadline


def _recipe(mds_root, tokenizer_dir, folder: Path, **overrides) -> dict:
    return tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="6ba", save_folder=str(folder),
                       save_interval="4ba", autoresume=True, preemption_check_interval=3, **overrides)


def test_a_flag_file_stops_at_the_agreed_batch_and_the_resumed_run_is_bitwise_equal(mds_root, tokenizer_dir,
                                                                                   tmp_path, monkeypatch):
    straight = make_trainer(_recipe(mds_root, tokenizer_dir, tmp_path / "straight"))
    straight.fit()
    flag, exit_file = tmp_path / "preempt", tmp_path / "exit"
    flag.touch()
    monkeypatch.setenv("LLMFOUNDRY_PREEMPT_FILE", str(flag))
    monkeypatch.setenv("LLMFOUNDRY_EXIT_FILE", str(exit_file))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        make_trainer(_recipe(mds_root, tokenizer_dir, tmp_path / "stopped")).fit()
    assert stopped.value.code == REQUEUE_EXIT_CODE and exit_file.read_text().strip() == str(REQUEUE_EXIT_CODE)
    assert latest_checkpoint(tmp_path / "stopped").name == "ep0-ba3"  # the first agreed batch
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.delenv("LLMFOUNDRY_PREEMPT_FILE")
    resumed = make_trainer(_recipe(mds_root, tokenizer_dir, tmp_path / "stopped"))
    assert resumed.time.batch == 3
    resumed.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.dist
@pytest.mark.slow
def test_sigusr2_to_one_rank_of_a_torchrun_job_checkpoints_all_and_resumes_bitwise(launch_recipe, tmp_path,
                                                                                  monkeypatch):
    """SIGUSR2 reaches rank 1 only; the ranks agree at the next check, save, exit 75; the resumed job matches."""
    entry = [*torchrun_args(2), "-m", "llmfoundry.cli", "train"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run_job(launch_recipe(straight), tmp_path, "straight", entry=entry)
    monkeypatch.setenv("LLMFOUNDRY_EXIT_FILE", str(tmp_path / "exit"))
    recipe = launch_recipe(stopped, preemption_check_interval=2)
    proc = launch(recipe, tmp_path, "stopped", entry=entry)
    deadline = time.monotonic() + 240
    while max(losses(stopped / "metrics.jsonl"), default=0) < 3 and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "stopped.log").read_text()[-3000:]
        time.sleep(0.02)
    rank1 = [pid for pid in rank_processes(1) if pid in descendants(proc.pid)]
    assert len(rank1) == 1
    os.kill(rank1[0], signal.SIGUSR2)
    assert proc.wait(timeout=120) != 0  # torchrun reports a failed worker as 1: the exit file says why
    assert "exitcode: 75" in (tmp_path / "stopped.log").read_text()
    assert (tmp_path / "exit").read_text().strip() == str(REQUEUE_EXIT_CODE)
    newest = latest_checkpoint(stopped / "ckpt")
    batch = int(newest.name.split("ba")[1])
    assert batch % 2 == 0 and batch < 10 and max(losses(stopped / "metrics.jsonl")) == batch, newest
    monkeypatch.delenv("LLMFOUNDRY_EXIT_FILE")
    run_job(recipe, tmp_path, "resumed", entry=entry)
    expected = checkpoint_weights(straight / "ckpt" / "ep0-ba10")
    got = checkpoint_weights(stopped / "ckpt" / "ep0-ba10")
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    reference, resumed = losses(straight / "metrics.jsonl"), losses(stopped / "metrics.jsonl")
    assert sorted(resumed) == list(range(1, 11)) and all(resumed[s] == reference[s] for s in resumed)
    rows = [r for p in stopped.glob("samples-*.jsonl") for r in p.read_text().splitlines()]
    assert len(rows) == 20  # 2 ranks x 10 batches: no batch trained twice
