"""llm-foundry's registered callbacks, part 1: stopping (early_stopper, nan_monitor, kill_loss_spike, run_timeout),
monitoring (optimizer_monitor, system_metrics_monitor, env_logging, loss_perp_v_len, CUDA memory snapshots) and
scheduled_gc. Each trains the tiny recipe for a few batches."""

from __future__ import annotations

import gc
import itertools
import json
import math
import signal
import subprocess
import time

import pytest
import torch
import torch.nn.functional as F

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks import cuda_memory
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.loss_perp_v_len import LossPerpVLen
from llmfoundry.train.callbacks.settings import LossPerpVLenSettings, MemorySnapshotSettings, OOMObserverSettings
from llmfoundry.train.errors import TrainingStopped
from tests.helpers import make_trainer


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class TableRecorder:
    """A logger that records tables (the ``log_table`` interface the callbacks hand tables to)."""

    def __init__(self):
        self.tables: list[tuple[str, list[str], list[list], int]] = []

    def log_table(self, columns, rows, name, step):
        self.tables.append((name, columns, rows, step))

    def log_hyperparameters(self, config): ...

    def log_metrics(self, metrics, step): ...

    def close(self): ...


class SetLoss(Callback):
    """Replaces the logged training loss of batch ``at`` (runs before the callbacks that read it)."""

    def __init__(self, at: int, value: float):
        self.at, self.value = at, value

    def on_batch_end(self, trainer, metrics):
        if trainer.time.batch == self.at:
            metrics["loss/train/total"] = self.value


# ----- stopping -----
def test_early_stopper_ends_the_run_cleanly_when_the_eval_metric_stops_improving(recipe, tmp_path):
    # comp gt on a falling loss: batch 1's value stays the best, so with patience 1ba the run stops at batch 3,
    # evaluated and checkpointed as at max_duration
    stopper = {"monitor": "LanguageCrossEntropy", "dataloader_label": "eval", "comp": "gt", "patience": "1ba"}
    trainer = make_trainer(recipe(max_duration="8ba", eval_interval="1ba", save_folder=str(tmp_path / "ck"),
                                  save_interval="10ba", callbacks={"early_stopper": stopper}))
    trainer.fit()
    assert trainer.time.batch == 3
    assert [batch for batch, _ in trainer.history.losses] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.is_dir()) == ["ep0-ba3"]


def test_early_stopper_on_the_train_loss_and_its_checks(recipe):
    # min_delta 100: no later loss counts as an improvement on batch 1's, so patience 2ba ends the run at batch 4
    stopper = {"monitor": "LanguageCrossEntropy", "dataloader_label": "train", "min_delta": 100, "patience": "2ba"}
    trainer = make_trainer(recipe(eval_loader=None, max_duration="8ba", callbacks={"early_stopper": stopper}))
    trainer.fit()
    assert trainer.time.batch == 4
    with pytest.raises(ConfigError, match=r"early_stopper.patience: with dataloader_label train it must be in batch"):
        make_trainer(recipe(callbacks={"early_stopper": dict(stopper, patience=1)}))
    with pytest.raises(ConfigError, match=r"early_stopper.monitor: no train metric 'metrics/train/Nope'"):
        make_trainer(recipe(eval_loader=None, max_duration="1ba", callbacks={
            "early_stopper": dict(stopper, monitor="Nope")})).fit()
    wrong = {"monitor": "Nope", "dataloader_label": "eval", "patience": "1ba"}
    with pytest.raises(ConfigError, match=r"no metric 'metrics/eval/Nope' after evaluation"):
        make_trainer(recipe(max_duration="2ba", eval_interval="1ba", callbacks={"early_stopper": wrong})).fit()


class Poison(Callback):
    def on_batch_start(self, trainer):
        if trainer.time.batch == 1:
            torch.nn.init.constant_(trainer.model.get_input_embeddings().weight, float("nan"))


def test_nan_monitor_stops_before_a_nan_batch_is_applied(recipe):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", callbacks={"nan_monitor": {}}))
    trainer.callbacks.insert(0, Poison())
    with pytest.raises(TrainingStopped, match=r"nan_monitor: the training loss is NaN at batch 2"):
        trainer.fit()
    assert trainer.time.batch == 1


def test_kill_loss_spike_stops_on_a_spike_or_only_logs_it(recipe):
    spike = {"window_size": 2, "patience": 0, "outlier_multiplier": 2, "log_only": False}
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", callbacks={"kill_loss_spike": spike}))
    trainer.callbacks.insert(0, SetLoss(4, 1000.0))
    with pytest.raises(TrainingStopped, match=r"kill_loss_spike: loss spike: 1 losses in a row .* at batch 4"):
        trainer.fit()
    # log_only: the run goes on; a loss cap below every loss makes the losses "persistently high" after 2 windows
    trainer = make_trainer(recipe(eval_loader=None, max_duration="5ba", callbacks={
        "kill_loss_spike": dict(spike, log_only=True, loss_cap=0.01, outlier_multiplier=100)}))
    trainer.fit()
    watcher = trainer.callbacks[0]
    assert trainer.time.batch == 5
    assert [event.split(":")[1].strip() for event in watcher.events] == ["high losses", "high losses"]
    assert watcher.events[0].endswith("at batch 4")


class FitEnd(Callback):
    def on_fit_end(self, trainer):
        self.at = time.monotonic()


def test_run_timeout_interrupts_a_process_that_lingers_after_training(recipe):
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(time.monotonic()))
    try:
        # 3 s: fit() still prints its summary and closes the loggers after on_fit_end, also on a slow machine
        trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", callbacks={"run_timeout": {"timeout": 3}}))
        fit_end = FitEnd()
        trainer.callbacks.insert(0, fit_end)  # on_fit_end just before run_timeout's starts its timer
        trainer.fit()
        assert not interrupted  # training itself is not limited
        deadline = time.monotonic() + 15
        while not interrupted and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted and 2.95 <= interrupted[0] - fit_end.at < 10


class GCProbe(Callback):
    def __init__(self):
        self.in_training, self.in_eval = [], []

    def on_batch_end(self, trainer, metrics):
        self.in_training.append(gc.isenabled())

    def on_eval_end(self, trainer, metrics):
        self.in_eval.append(gc.isenabled())


def test_scheduled_gc_turns_automatic_collection_off_during_training(recipe):
    assert gc.isenabled()
    trainer = make_trainer(recipe(max_duration="4ba", eval_interval="2ba", callbacks={
        "scheduled_gc": {"batch_interval": 2, "gen_1_batch_interval": 1}}))
    probe = GCProbe()
    trainer.callbacks.insert(0, probe)  # its on_eval_end runs before scheduled_gc turns collection off again
    trainer.fit()
    assert probe.in_training == [False] * 4 and probe.in_eval == [True, True]
    assert trainer.callbacks[1].collections == 2  # before batches 1 and 3 (0 and 2 done)
    assert gc.isenabled()  # as it was before training


# ----- monitoring -----
class Before(Callback):
    """The weights just before the optimizer step of batch ``at``."""

    def __init__(self, at: int):
        self.at, self.weights = at, {}

    def should_skip_step(self, trainer, loss):
        if trainer.time.batch + 1 == self.at:
            self.weights = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        return False


def test_optimizer_monitor_logs_composer_named_norms(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", loggers={"jsonl": {"path": str(path)}},
                                  callbacks={"optimizer_monitor": {"batch_log_interval": 2}}))
    before = Before(2)
    trainer.callbacks.insert(0, before)
    trainer.fit()
    steps = [r for r in rows(path) if "step" in r]
    assert not any(k.startswith("l2_norm/") for k in steps[0])
    logged = steps[1]
    name = "model.transformer.blocks.0.ffn.up_proj.weight"
    param = dict(trainer.model.named_parameters())[name.removeprefix("model.")]
    assert logged[f"l2_norm/param/{name}"] == pytest.approx(float(param.detach().norm()), rel=1e-5)
    # the update is the step just applied (Adam direction x bias-corrected lr, plus weight decay)
    applied = param.detach() - before.weights[name.removeprefix("model.")]
    assert logged[f"l2_norm/update/{name}"] == pytest.approx(float(applied.norm()), rel=1e-3)
    grads = [v for k, v in logged.items() if k.startswith("l2_norm/grad/model.")]
    assert len(grads) == len(list(trainer.model.parameters()))
    assert logged["l2_norm/grad/global"] == pytest.approx(math.sqrt(sum(g * g for g in grads)))
    assert logged["l2_norm/grad/global"] <= 1.0 + 1e-5  # after gradient_clipping (threshold 1.0)
    assert f"l2_norm/moment/{name}" in logged


def test_gpu_metrics_name_the_gpu_by_its_uuid_as_nvml_spells_it():
    """NVML is asked for the GPU by UUID (torch's index is not NVML's under CUDA_VISIBLE_DEVICES binding): torch's
    bare UUID as a whole GPU's GPU- name, then a MIG instance's MIG- name; a prefixed name as it is."""
    import uuid

    from llmfoundry.train.callbacks.environment import nvml_names

    bare = uuid.UUID("5f3b8a1e-2c4d-4e6f-8a9b-0c1d2e3f4a5b")
    assert nvml_names(bare) == ["GPU-5f3b8a1e-2c4d-4e6f-8a9b-0c1d2e3f4a5b", "MIG-5f3b8a1e-2c4d-4e6f-8a9b-0c1d2e3f4a5b"]
    assert nvml_names("GPU-5f3b8a1e-2c4d-4e6f-8a9b-0c1d2e3f4a5b") == ["GPU-5f3b8a1e-2c4d-4e6f-8a9b-0c1d2e3f4a5b"]


def test_system_metrics_monitor_logs_cpu_memory_disk_and_network(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    make_trainer(recipe(eval_loader=None, max_duration="2ba", loggers={"jsonl": {"path": str(path)}},
                        callbacks={"system_metrics_monitor": {}})).fit()
    last = rows(path)[-1]
    assert 0 <= last["cpu_percentage"] <= 100 * 64
    assert last["cpu_memory_total"] > last["cpu_memory_available"] > 0
    assert last["disk_memory_total"] > 0 and "network_bytes_sent" in last
    if not torch.cuda.is_available():
        assert not any("gpu_percentage" in k for k in last)


def test_env_logging_logs_git_commits_and_package_versions(recipe, tmp_path):
    repo = tmp_path / "workspace" / "myrepo"
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "f.txt").write_text("x")
    subprocess.run(git + ["add", "f.txt"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    path = tmp_path / "m.jsonl"
    make_trainer(recipe(eval_loader=None, max_duration="2ba", loggers={"jsonl": {"path": str(path)}},
                        callbacks={"env_logging": {"workspace_dir": str(repo.parent), "log_system": True,
                                                   "log_distributed": True}})).fit()
    logged = [r["hyperparameters"] for r in rows(path) if "hyperparameters" in r]
    env = next(h["environment_data"] for h in logged if "environment_data" in h)
    assert env["git_info"] == {"myrepo": {"commit_hash": commit, "branch": "main"}}
    assert env["package_versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["distributed_info"]["world_size"] == 1 and env["system_info"]["cpu_info"]["threads"] >= 1


def test_loss_perp_v_len_tables_average_the_loss_by_position(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", loggers={"jsonl": {"path": str(path)}},
                                  callbacks={"loss_perp_v_len": {"compute_batch_interval": 1,
                                                                 "log_batch_interval": 2}}))
    recorder = TableRecorder()
    trainer.loggers.append(recorder)
    trainer.fit()
    names = {name.rsplit("/", 1)[1] for name, *_ in recorder.tables}
    assert names == {"mean_loss_v_len", "mean_perplexity_v_len", "sum_length", "mean_loss_seq_id_v_len",
                     "mean_perplexity_seq_id_v_len", "sum_length_seq_id"}
    tables = {(name.rsplit("/", 1)[1], step): (columns, table) for name, columns, table, step in recorder.tables}
    columns, (first,) = tables[("mean_loss_v_len", 1)]  # logged after the first batch (batch index 0)
    assert columns[-1] == "batch_index" and len(columns) == 65 and first[-1] == 0
    (lengths,) = tables[("sum_length", 1)][1]
    assert lengths[:63] == [8] * 63 and lengths[63] == 0  # 8 samples; the last position has no next token
    assert first[63] == -1
    loss = sum(first[i] * lengths[i] for i in range(63)) / sum(lengths[:63])
    first_step = [r for r in rows(path) if "step" in r][0]  # the jsonl file also holds the tables
    assert loss == pytest.approx(first_step["loss/train/total"], rel=1e-4)  # the batch's loss, by position
    assert [row[-1] for row in tables[("mean_loss_v_len", 3)][1]] == [1, 2]


def test_loss_perp_v_len_realigns_packed_sequences():
    callback = LossPerpVLen(LossPerpVLenSettings(log_batch_interval=1, compute_batch_interval=1))
    torch.manual_seed(0)
    logits = torch.randn(1, 6, 5)
    labels = torch.tensor([[1, 2, 3, 4, 0, -100]])
    sequence_id = torch.tensor([[0, 0, 0, 1, 1, -1]])
    callback._update(labels, logits, sequence_id)
    targets = torch.tensor([2, 3, 4, 0, -100, -100])
    loss = F.cross_entropy(logits[0], targets, ignore_index=-100, reduction="none")
    # position 0 of each packed sequence: tokens 0 and 3; position 1: tokens 1 and 4; position 2: token 2
    expected = torch.stack([loss[0] + loss[3], loss[1] + loss[4], loss[2]])
    torch.testing.assert_close(callback.sums["loss_seq_id"][:3], expected)
    assert callback.sums["length_seq_id"].tolist() == [2, 1, 1, 0, 0, 0]
    assert callback.sums["length"].tolist() == [1, 1, 1, 1, 0, 0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the notice on machines without CUDA")
@pytest.mark.parametrize("name", ["memory_snapshot", "oom_observer"])
def test_cuda_memory_callbacks_do_nothing_on_a_cpu_with_a_notice(recipe, tmp_path, caplog, name):
    folder = tmp_path / "traces"
    make_trainer(recipe(eval_loader=None, max_duration="2ba", callbacks={name: {"folder": str(folder)}})).fit()
    assert not folder.exists()
    assert f"callbacks.{name}: CUDA memory snapshots need a CUDA device" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_memory_snapshot_writes_the_allocator_history_on_cuda(recipe, tmp_path):
    folder = tmp_path / "traces"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", callbacks={
        "memory_snapshot": {"folder": str(folder), "interval": "2ba", "skip_batches": 1},
        "oom_observer": {"folder": str(tmp_path / "oom")}}))
    trainer.fit()
    # recording starts before batch 2 (one skipped) and the files are written after batch 3
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.3.memory_snapshot.html",
                                                        "rank0.3.memory_snapshot.pickle"]
    observer = trainer.callbacks[1]
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    # the flame graphs need perl and flamegraph.pl in ~/.cache (torch would download it: not inside an OOM handler)
    flamegraphs = ["_memory_flamegraph.svg", "_segment_flamegraph.svg"] if cuda_memory.flamegraphs_available() else []
    assert sorted(p.name.removeprefix("rank0_oom") for p in observer.written) == sorted([
        *flamegraphs, "_segment_plot.html", "_snapshot.pickle", "_trace_plot.html"])
    assert all(p.stat().st_size > 0 for p in observer.written)
    observer.stop()  # the history goes off with the last claim on it
    assert cuda_memory.HISTORY.settings() is None


def test_a_snapshot_view_that_cannot_be_drawn_costs_only_itself(tmp_path, caplog):
    def offline(snapshot):
        raise OSError("Temporary failure in name resolution")  # what the flame graphs' download met on the H200

    views = {"_snapshot.pickle": None, "_memory_flamegraph.svg": offline, "_trace_plot.html": lambda s: "<html/>"}
    written = cuda_memory._write({"device_traces": [[]]}, views, tmp_path / "rank0_oom")
    assert [p.name for p in written] == ["rank0_oom_snapshot.pickle", "rank0_oom_trace_plot.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in written]
    assert "rank0_oom_memory_flamegraph.svg: Temporary failure in name resolution" in caplog.text


def history_calls(monkeypatch) -> list:
    """What the callbacks ask torch.cuda.memory._record_memory_history for, in order (HISTORY with a recorder)."""
    calls = []
    monkeypatch.setattr(cuda_memory, "HISTORY", cuda_memory.AllocatorHistory(
        lambda enabled, **settings: calls.append(None if enabled is None else dict(settings, enabled=enabled))))
    return calls


def test_memory_snapshot_ending_its_window_leaves_oom_observers_history_on(monkeypatch):
    # #30: memory_snapshot turned the allocator's history off (which also clears it) at the end of its window, so
    # an oom_observer of the same run had nothing to write when CUDA ran out of memory afterwards
    calls = history_calls(monkeypatch)
    observer = cuda_memory.OOMObserver(OOMObserverSettings(max_entries=500))
    snapshot = cuda_memory.MemorySnapshot(MemorySnapshotSettings(max_entries=200))
    observer.record()  # fit start
    snapshot.record()  # after skip_batches
    snapshot.stop()  # the snapshot is written
    oom_settings = dict(enabled="all", context="alloc", stacks="python", max_entries=500)
    # while both record: the most of each (memory_snapshot's C++ stacks and free contexts, oom_observer's entries)
    assert calls == [oom_settings, dict(enabled="all", context="all", stacks="all", max_entries=500), oom_settings]
    snapshot.on_fit_end(None)  # already released: nothing changes
    assert calls[-1] == oom_settings and len(calls) == 3
    observer.stop()
    assert calls[-1] is None and cuda_memory.HISTORY.settings() is None


def test_memory_snapshot_alone_turns_the_history_off_at_the_end_of_its_window_or_of_the_run(monkeypatch):
    calls = history_calls(monkeypatch)
    snapshot = cuda_memory.MemorySnapshot(MemorySnapshotSettings(max_entries=200))
    snapshot.record()
    snapshot.stop()
    assert calls == [dict(enabled="all", context="all", stacks="all", max_entries=200), None]
    snapshot.record()
    snapshot.on_fit_end(None)  # a run that ends inside the window
    assert calls[-1] is None


def test_oom_observer_started_inside_a_snapshot_window_keeps_recording_after_it(monkeypatch):
    calls = history_calls(monkeypatch)
    snapshot = cuda_memory.MemorySnapshot(MemorySnapshotSettings(max_entries=300))
    observer = cuda_memory.OOMObserver(OOMObserverSettings(max_entries=100))
    snapshot.record()
    observer.record()
    snapshot.stop()
    assert calls[1] == dict(enabled="all", context="all", stacks="all", max_entries=300)
    assert calls[-1] == dict(enabled="all", context="alloc", stacks="python", max_entries=100)


def test_fdiff_metrics_logs_the_change_since_the_previous_value(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    make_trainer(recipe(max_duration="3ba", eval_interval="1ba", loggers={"jsonl": {"path": str(path)}},
                        callbacks={"fdiff_metrics": {"diff_train_metrics": True}})).fit()
    steps = [r for r in rows(path) if "step" in r]
    assert not any(k.endswith("_fdiff") for k in steps[0])
    for before, now in itertools.pairwise(steps):
        for name in ("loss/train/total", "metrics/eval/LanguageCrossEntropy"):
            assert now[f"{name}_fdiff"] == pytest.approx(now[name] - before[name])
