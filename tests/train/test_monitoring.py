"""Callbacks and loggers: throughput/MFU, memory, runtime estimate, loss-spike guard, HF export, tensorboard,
mlflow, wandb (offline), and secrets kept out of logged configs."""

from __future__ import annotations

import json
import os

import pytest
import torch

from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.trainer import TrainingStopped
from tests.helpers import make_trainer


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_monitors_log_throughput_memory_and_time_left(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", loggers={"jsonl": {"path": str(path)}},
                                  callbacks={"speed_monitor": {"window_size": 2}, "memory_monitor": {},
                                             "runtime_estimator": {}, "lr_monitor": {}}))
    trainer.fit()
    steps = [r for r in rows(path) if "step" in r]
    last = steps[-1]
    assert last["throughput/tokens_per_sec"] > 0 and last["throughput/samples_per_sec"] > 0
    assert last["throughput/tokens_per_sec"] == pytest.approx(64 * last["throughput/samples_per_sec"])
    assert last["throughput/device/flops_per_sec"] > 0
    assert "throughput/device/mfu" not in last  # no known peak on a CPU
    assert last["memory/peak_rss_mem"] > 0
    assert last["time/remaining_estimate"] == 0 and steps[-2]["time/remaining_estimate"] > 0
    # as Composer: throughput once the window holds window_size batches after the first one
    assert [("throughput/tokens_per_sec" in s) for s in steps] == [False, False, True, True]


def test_mfu_is_achieved_flops_over_the_peak(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    make_trainer(recipe(eval_loader=None, max_duration="3ba", loggers={"jsonl": {"path": str(path)}},
                        callbacks={"speed_monitor": {"window_size": 1, "gpu_flops_available": 1e9}})).fit()
    last = rows(path)[-1]
    assert last["throughput/device/mfu"] == pytest.approx(last["throughput/device/flops_per_sec"] / 1e9)


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.5), ("NVIDIA H200", 989.5),
                                        ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", None)])
def test_speed_monitor_finds_the_dense_bf16_peak_from_the_device_name(name, peak, monkeypatch):
    from llmfoundry.train.callbacks import speed_monitor

    asked = []
    monkeypatch.setattr(speed_monitor.torch.cuda, "get_device_name", lambda device: asked.append(device) or name)
    cuda = torch.device("cuda", 0)
    assert speed_monitor.device_peak_tflops(cuda) == peak
    assert asked == [cuda]
    assert speed_monitor.device_peak_tflops(torch.device("cpu")) is None
    assert asked == [cuda]  # a CPU is never looked up as a CUDA device


class Poison(Callback):
    """Fills the embeddings with NaN before batch ``at``, so that its loss is NaN."""

    def __init__(self, at: int):
        self.at = at

    def on_batch_start(self, trainer):
        if trainer.time.batch + 1 == self.at:
            torch.nn.init.constant_(trainer.model.get_input_embeddings().weight, float("nan"))


def test_nan_loss_stops_training_with_a_clear_message(recipe, tmp_path):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", callbacks={"loss_spike_guard": {}}))
    trainer.callbacks.insert(0, Poison(3))
    with pytest.raises(TrainingStopped, match=r"loss_spike_guard: the training loss is nan at batch 3"):
        trainer.fit()
    assert trainer.time.batch == 2


def test_loss_spike_guard_can_skip_bad_batches(recipe, tmp_path):
    # spike_factor 0.5: every loss after the first two counts as a spike, so every later update is skipped.
    guard = {"action": "skip", "spike_factor": 0.5, "min_history": 2, "max_consecutive_skips": 10}
    trainer = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="5ba",
                                  callbacks={"loss_spike_guard": guard}))
    trainer.fit()
    reference = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="2ba"))
    reference.fit()
    assert trainer.time.batch == 5
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
    stop = dict(guard, max_consecutive_skips=1)
    with pytest.raises(TrainingStopped, match="2 batches in a row"):
        make_trainer(recipe(eval_loader=None, max_duration="5ba", callbacks={"loss_spike_guard": stop})).fit()


class NaNBatch(Callback):
    """Makes batch ``at``'s loss NaN through a forward hook on the embeddings; the weights stay as they are."""

    def __init__(self, at: int):
        self.at = at
        self.hook = None

    def on_batch_start(self, trainer):
        if trainer.time.batch + 1 == self.at:
            self.hook = trainer.model.get_input_embeddings().register_forward_hook(lambda m, i, out: out * torch.nan)
        elif self.hook is not None:
            self.hook.remove()
            self.hook = None


def test_loss_spike_guard_checkpoint_saves_without_the_bad_update_and_resuming_goes_on_as_skip(recipe, tmp_path):
    def run(action, **extra):
        r = recipe(eval_loader=None, max_duration="5ba", callbacks={"loss_spike_guard": {"action": action}}, **extra)
        trainer = make_trainer(r)
        trainer.callbacks.insert(0, NaNBatch(3))
        return trainer

    skipping = run("skip")
    skipping.fit()
    stopping = run("checkpoint", save_folder=str(tmp_path / "ckpt"), save_interval="10ba")
    with pytest.raises(TrainingStopped, match=r"the training loss is nan at batch 3; saved .*ep0-ba3 without"):
        stopping.fit()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ep*")) == ["ep0-ba3"]
    resumed = run("checkpoint", save_folder=str(tmp_path / "ckpt"), save_interval="10ba", autoresume=True)
    resumed.fit()
    assert resumed.time.batch == 5
    for name, value in skipping.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    with pytest.raises(TrainingStopped, match="no save_folder, so nothing was saved"):
        run("checkpoint").fit()


def test_hf_checkpointer_exports_loadable_transformers_folders(recipe, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    base = recipe()
    model = dict(base["model"], expansion_ratio=4, no_bias=True)  # what transformers' MptForCausalLM can hold
    trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", model=model, callbacks={
        "hf_checkpointer": {"save_folder": str(out), "save_interval": "2ba", "precision": "fp32"}}))
    trainer.fit()
    # llm-foundry's layout: save_folder/huggingface/ba{batch}, and nothing half-written left beside them
    assert [p.name for p in out.iterdir()] == ["huggingface"]
    assert sorted(p.name for p in (out / "huggingface").iterdir()) == ["ba2", "ba3"]
    hf = AutoModelForCausalLM.from_pretrained(str(out / "huggingface" / "ba3"))
    ids = torch.tensor([[1, 5, 9, 13]])
    ours = trainer.model.eval()(ids).logits
    torch.testing.assert_close(hf(ids).logits, ours, rtol=1e-4, atol=1e-4)


def test_tensorboard_and_mlflow_loggers_record_metrics(recipe, tmp_path, monkeypatch):
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # so that teardown puts back whatever was there before
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # unset: the logger must set it itself
    make_trainer(recipe(eval_loader=None, max_duration="3ba", run_name="logged", loggers={
        "tensorboard": {"log_dir": str(tmp_path / "tb")},
        "mlflow": {"tracking_uri": uri, "experiment_name": "tests"}})).fit()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "logged"))  # Composer's <log_dir>/<run_name>
    events.Reload()
    assert [e.step for e in events.Scalars("loss/train/total")] == [1, 2, 3]

    import mlflow

    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # set by the logger for its local file store
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.run_name == "logged"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss/train/total")] == [1, 2, 3]
    assert run.data.params["max_duration"] == "3ba"


def test_wandb_logs_offline(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    make_trainer(recipe(eval_loader=None, max_duration="2ba", loggers={
        "wandb": {"project": "tests", "dir": str(tmp_path), "mode": "offline"}})).fit()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_secrets_never_reach_logged_or_saved_configs(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    secrets = {"hf_token": "hf_" + "a" * 30, "api_key": "12345", "password": "hunter2",
               "note": "sk-" + "b" * 30, "max_new_tokens": 7}
    make_trainer(recipe(eval_loader=None, max_duration="1ba", metadata=secrets, save_folder=str(tmp_path / "ck"),
                        loggers={"jsonl": {"path": str(path)}})).fit()
    logged = rows(path)[0]["hyperparameters"]  # flatten_metadata (default true): metadata's keys at the top level
    assert {k: logged[k] for k in secrets} == {"hf_token": "********", "api_key": "********", "password": "********",
                                               "note": "********", "max_new_tokens": 7}
    saved = (tmp_path / "ck" / "ep0-ba1" / "config.yaml").read_text()
    for value in ("hunter2", "12345", "hf_aaaa", "sk-bbbb"):
        assert value not in saved and value not in path.read_text()
