"""Composer's keys of the wandb, mlflow, tensorboard and inmemory loggers, asserted on what each one wrote: wandb's
offline run file, MLflow's file store, tensorboard's event files, the in-memory logger's tables."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.loggers.in_memory import InMemoryLogger
from tests.helpers import make_trainer

SECRET = "hf_" + "s" * 30


def wandb_records(run_file):
    """The protobuf records of an offline run's run-<id>.wandb (a LevelDB-style log: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += block - pos % block
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_run(folder):
    """(the run file, its records by type), once wandb has written the run's exit record."""
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.time() + 30
    while True:  # wandb-core may still be writing after run.finish() returned
        records = {}
        for record in wandb_records(run_file):
            records.setdefault(record.WhichOneof("record_type"), []).append(record)
        if "exit" in records or time.time() > deadline:
            return run_file, records
        time.sleep(0.2)


def test_wandb_keys_reach_the_offline_run_and_secrets_do_not(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb = {"project": "tests", "group": "g1", "name": "named", "tags": ["a", "b"], "dir": str(tmp_path),
             # the named keys win over init_kwargs (Composer's order); a config passed here is masked too
             "init_kwargs": {"project": "not-this", "notes": "from init_kwargs", "config": {"api_key": "k-123"}}}
    make_trainer(recipe(eval_loader=None, max_duration="2ba", metadata={"hf_token": SECRET},
                        loggers={"wandb": wandb})).fit()
    run_file, records = offline_run(tmp_path)
    (run,) = [r.run for r in records["run"]]
    assert (run.project, run.run_group, run.display_name, list(run.tags), run.notes) == (
        "tests", "g1", "named", ["a", "b"], "from init_kwargs")
    steps = [{item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
              for item in r.history.item} for r in records["history"]]
    assert [s["_step"] for s in steps] == [1, 2] and all("loss/train/total" in s for s in steps)
    config = {u.key: json.loads(u.value_json) for r in records["config"] for u in r.config.update}
    assert config["max_duration"] == "2ba" and config["hf_token"] == "********"
    raw = run_file.read_bytes()
    assert SECRET.encode() not in raw and b"k-123" not in raw


def test_wandb_names_the_run_after_the_recipe_and_logs_checkpoints_as_artifacts(tmp_path, monkeypatch):
    from llmfoundry.train.loggers.settings import WandbSettings
    from llmfoundry.train.loggers.wandb import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    checkpoint = tmp_path / "ck" / "ep0-ba2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "rank0.pt").write_bytes(b"x")
    logger = WandbLogger(WandbSettings(dir=str(tmp_path), log_artifacts=True), "my-run")
    logger.log_checkpoint(str(checkpoint), epoch=0, batch=2)
    logger.close()
    _, records = offline_run(tmp_path)
    assert records["run"][0].run.display_name == "my-run"
    (artifact,) = [r.artifact for r in records["artifact"]]
    assert (artifact.name, artifact.type, sorted(artifact.aliases)) == ("ep0-ba2", "checkpoint",
                                                                      ["ep0-ba2", "latest"])
    assert [entry.path for entry in artifact.manifest.contents] == ["rank0.pt"]
    assert json.loads(artifact.metadata) == {"timestamp/epoch": 0, "timestamp/batch": 2}


def test_wandb_logs_an_s3_checkpoint_as_a_reference_without_reading_the_bucket(tmp_path, monkeypatch):
    from llmfoundry.train.loggers.settings import WandbSettings
    from llmfoundry.train.loggers.wandb import WandbLogger

    # the trainer reports a remote checkpoint while it may still be uploading: no bucket is reached (none exists here)
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(WandbSettings(dir=str(tmp_path), log_artifacts=True), "s3-run")
    logger.log_checkpoint("s3://no-such-bucket/ck/ep0-ba4", epoch=0, batch=4)
    logger.close()
    _, records = offline_run(tmp_path)
    (artifact,) = [r.artifact for r in records["artifact"]]
    assert (artifact.name, sorted(artifact.aliases)) == ("ep0-ba4", ["ep0-ba4", "latest"])
    assert [entry.ref for entry in artifact.manifest.contents] == ["s3://no-such-bucket/ck/ep0-ba4/"]


@pytest.mark.parametrize("save_async", [False, True])
def test_wandb_log_artifacts_records_each_checkpoint_the_trainer_saves(recipe, tmp_path, monkeypatch, save_async):
    """With save_async the artifact is logged once the background write is complete (its files exist)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(tmp_path / "ck"), save_interval="1ba",
                        save_async=save_async, loggers={"wandb": {"dir": str(tmp_path), "log_artifacts": True}})).fit()
    _, records = offline_run(tmp_path)
    artifacts = [r.artifact for r in records["artifact"]]
    assert [(a.name, a.type, sorted(a.aliases)) for a in artifacts] == [
        ("ep0-ba1", "checkpoint", ["ep0-ba1", "latest"]), ("ep0-ba2", "checkpoint", ["ep0-ba2", "latest"])]
    for artifact in artifacts:  # each artifact holds its checkpoint folder's files
        folder = tmp_path / "ck" / artifact.name
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        assert files and sorted(entry.path for entry in artifact.manifest.contents) == files
    assert json.loads(artifacts[-1].metadata) == {"timestamp/epoch": 0, "timestamp/batch": 2}


@pytest.mark.parametrize("loggers, message", [
    ({"wandb": {"rank_zero_only": False}}, "loggers.wandb.rank_zero_only: logging from every rank"),
    ({"mlflow": {"rank_zero_only": False}}, "loggers.mlflow.rank_zero_only: logging from every rank"),
    ({"mlflow": {"tracking_uri": "databricks"}}, "loggers.mlflow.tracking_uri: 'databricks' needs Databricks"),
    ({"mlflow": {"model_registry_uri": "databricks-uc"}}, "loggers.mlflow.model_registry_uri: 'databricks-uc'"),
    ({"tensorboard": {"rank_zero_only": False}}, "loggers.tensorboard.rank_zero_only: logging from every rank"),
    ({"tensorboard": {"flush_interval": 0}}, "loggers.tensorboard.flush_interval: must be at least 1"),
    ({"inmemory": {"x": 1}}, "loggers.inmemory.x"),
    ({"mosaicml": {"log_interval": 60}}, "loggers.mosaicml: not available here: it reports to the MosaicML platform"),
])
def test_logger_keys_that_cannot_work_here_are_one_line_errors(recipe, loggers, message):
    with pytest.raises(ConfigError, match=message) as error:
        make_trainer(recipe(loggers=loggers))
    assert "\n" not in str(error.value).strip()


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A local MLflow file store; the environment the logger may set is put back afterwards."""
    for name in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "MLFLOW_RUN_ID",
                 "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_URI",
                 "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return f"file:{tmp_path / 'mlruns'}"


def mlflow_runs(uri, experiment):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    return client, client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_mlflow_keys_filter_rename_and_tag_what_is_logged(recipe, file_store):
    mlflow = {"tracking_uri": file_store, "experiment_name": "keys", "run_name": "shown", "run_group": "grp",
              "tags": {"team": "llm", "api_key": "k-123"}, "synchronous": True, "log_system_metrics": False,
              "rename_metrics": {"loss/train/total": "train_loss"}, "ignore_metrics": ["time/sample", "time/tok*"],
              "ignore_hyperparameters": ["model", "optim*"], "log_duplicated_metric_every_n_steps": 2}
    make_trainer(recipe(eval_loader=None, max_duration="4ba", run_name="recipe-run", loggers={"mlflow": mlflow})).fit()
    client, (run,) = mlflow_runs(file_store, "keys")
    assert run.info.run_name == "shown" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["run_name"], tags["run_group"], tags["team"], tags["api_key"]) == ("recipe-run", "grp", "llm",
                                                                                    "********")
    assert "train_loss" in run.data.metrics and "loss/train/total" not in run.data.metrics
    assert "time/batch" in run.data.metrics and not {"time/sample", "time/token"} & set(run.data.metrics)
    params = run.data.params
    assert params["max_duration"] == "4ba" and params["mlflow_run_id"] == run.info.run_id
    assert not [p for p in params if p.startswith(("model.", "optimizer."))]
    # time/epoch stays 0: an unchanged value is logged again only every 2 steps; time/batch changes every step
    assert [m.step for m in client.get_metric_history(run.info.run_id, "time/epoch")] == [1, 3]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "time/batch")] == [1, 2, 3, 4]


def test_mlflow_resume_continues_the_run_with_the_same_run_name(file_store):
    from llmfoundry.train.loggers.mlflow import MLflowLogger
    from llmfoundry.train.loggers.settings import MLflowSettings

    def log(step: int, resume: bool) -> None:
        logger = MLflowLogger(MLflowSettings(tracking_uri=file_store, experiment_name="resume", resume=resume,
                                             log_system_metrics=False, synchronous=True), "same-name")
        logger.log_hyperparameters({"max_duration": f"{step}ba"})  # a changed param keeps its first value
        logger.log_metrics({"loss": float(step)}, step)
        logger.close()

    log(1, resume=True)
    log(2, resume=True)
    client, (run,) = mlflow_runs(file_store, "resume")
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 1.0), (2, 2.0)]
    assert run.data.params["max_duration"] == "1ba"
    log(3, resume=False)
    assert len(mlflow_runs(file_store, "resume")[1]) == 2


def test_mlflow_system_metrics_and_model_registry_work_on_a_file_store(file_store, tmp_path, monkeypatch):
    from llmfoundry.train.loggers.mlflow import MLflowLogger
    from llmfoundry.train.loggers.settings import MLflowSettings

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")  # instead of Composer's 5 s x 6
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    logger = MLflowLogger(MLflowSettings(tracking_uri=file_store, experiment_name="system",
                                         model_registry_uri=file_store, model_registry_prefix="team"), "sys")
    model = tmp_path / "model"
    model.mkdir()
    version = logger.register_model(str(model), "tiny", await_registration_for=0)
    deadline = time.time() + 20
    while time.time() < deadline and not logger.client.get_run(logger.run_id).data.metrics:
        time.sleep(0.2)
    logger.close()
    client, (run,) = mlflow_runs(file_store, "system")
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert (version.name, version.source) == ("team.tiny", str(model))


def test_mlflow_run_is_failed_when_training_fails_or_the_process_dies(file_store, tmp_path):
    from llmfoundry.train.loggers.mlflow import MLflowLogger
    from llmfoundry.train.loggers.settings import MLflowSettings

    # logging_buffer_seconds: None, else the process would wait that long at exit for MLflow's logging thread
    logger = MLflowLogger(MLflowSettings(tracking_uri=file_store, experiment_name="status", log_system_metrics=False,
                                         logging_buffer_seconds=None), "crashed")
    try:
        try:
            raise RuntimeError("training failed")
        finally:
            logger.close()  # as `llmfoundry eval` closes its loggers
    except RuntimeError:
        pass
    script = ("from llmfoundry.train.loggers.mlflow import MLflowLogger\n"
              "from llmfoundry.train.loggers.settings import MLflowSettings\n"
              f"MLflowLogger(MLflowSettings(tracking_uri={file_store!r}, experiment_name='status', "
              "log_system_metrics=False, logging_buffer_seconds=None), 'died')\n"
              "raise SystemExit(3)\n")
    assert subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True).returncode == 3
    _, runs = mlflow_runs(file_store, "status")
    assert sorted((r.data.tags["run_name"], r.info.status) for r in runs) == [("crashed", "FAILED"),
                                                                              ("died", "FAILED")]


def test_mlflow_databricks_tracking_from_the_environment_is_a_one_line_error(file_store, monkeypatch):
    from llmfoundry.train.loggers.mlflow import MLflowLogger
    from llmfoundry.train.loggers.settings import MLflowSettings

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")
    with pytest.raises(ConfigError, match=r"loggers.mlflow.tracking_uri \(from MLFLOW_TRACKING_URI\): 'databricks'"):
        MLflowLogger(MLflowSettings(), "r")


def test_tensorboard_writes_under_the_run_name_and_records_hparams_at_the_end(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from llmfoundry.train.loggers.settings import TensorboardSettings
    from llmfoundry.train.loggers.tensorboard import TensorboardLogger

    logger = TensorboardLogger(TensorboardSettings(log_dir=str(tmp_path), flush_interval=2), "tb-run")
    logger.log_hyperparameters({"max_duration": "3ba", "lr": 0.1})

    def scalars() -> list[int]:
        events = EventAccumulator(str(tmp_path / "tb-run"))
        events.Reload()
        return [e.step for e in events.Scalars("loss/train/total")] if "loss/train/total" in events.Tags()[
            "scalars"] else []

    logger.log_metrics({"loss/train/total": 2.0, "throughput/x": 1.0}, 1)
    logger.log_metrics({"loss/train/total": 1.5, "throughput/x": 1.0}, 2)
    assert scalars() == [1, 2]  # flushed at step 2, before the run ends
    logger.log_metrics({"loss/train/total": 1.2, "throughput/x": 1.0}, 3)
    logger.close()
    assert scalars() == [1, 2, 3]
    hparams = EventAccumulator(str(tmp_path / "tb-run" / "tb-run"))
    hparams.Reload()
    assert "hparams/loss/train/total" in hparams.Tags()["scalars"]
    assert "hparams/throughput/x" not in hparams.Tags()["scalars"]  # only metrics named *metric* or *loss*
    assert hparams.Scalars("hparams/loss/train/total")[0].value == pytest.approx(1.2)


@pytest.mark.parametrize("name", ["inmemory", "in_memory_logger"])
def test_inmemory_logger_keeps_every_value_with_its_time(recipe, name):
    trainer = make_trainer(recipe(max_duration="3ba", eval_interval="2ba", metadata={"hf_token": SECRET},
                                  loggers={name: {}}))
    trainer.fit()
    (logger,) = trainer.loggers
    assert isinstance(logger, InMemoryLogger)
    assert [when.batch for when, _ in logger.data["loss/train/total"]] == [1, 2, 3]
    assert [when.sample for when, _ in logger.data["loss/train/total"]] == [8, 16, 24]
    assert logger.most_recent_values["loss/train/total"] == logger.data["loss/train/total"][-1][1]
    assert logger.most_recent_timestamps["metrics/eval/LanguageCrossEntropy"].batch == 3  # the final evaluation
    assert logger.hyperparameters["max_duration"] == "3ba" and logger.hyperparameters["hf_token"] == "********"
    series = logger.get_timeseries("loss/train/total")
    assert list(series["batch"]) == [1, 2, 3] and list(series["token"]) == [8 * 64, 16 * 64, 24 * 64]
    assert list(series["loss/train/total"]) == [v for _, v in logger.data["loss/train/total"]]
    with pytest.raises(ValueError, match="no metric 'nope'"):
        logger.get_timeseries("nope")


def test_loggers_mask_secrets_in_hyperparameters_whoever_logs_them(tmp_path, file_store):
    from llmfoundry.train.loggers.jsonl import JsonlLogger
    from llmfoundry.train.loggers.mlflow import MLflowLogger
    from llmfoundry.train.loggers.settings import JsonlSettings, MLflowSettings

    config = {"run": "r", "model": {"api_key": "k-123", "hf_token": SECRET}}
    jsonl = JsonlLogger(JsonlSettings(path=str(tmp_path / "m.jsonl")))
    memory = InMemoryLogger()
    mlflow = MLflowLogger(MLflowSettings(tracking_uri=file_store, experiment_name="masked", synchronous=True,
                                         log_system_metrics=False), "r")
    for logger in (jsonl, memory, mlflow):
        logger.log_hyperparameters(config)
        logger.close()
    assert memory.hyperparameters["model"] == {"api_key": "********", "hf_token": "********"}
    assert "k-123" not in (tmp_path / "m.jsonl").read_text() and SECRET not in (tmp_path / "m.jsonl").read_text()
    _, (run,) = mlflow_runs(file_store, "masked")
    assert run.data.params["model.api_key"] == "********" and run.data.params["model.hf_token"] == "********"
