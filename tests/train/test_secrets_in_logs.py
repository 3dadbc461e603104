"""Secrets in a recipe reach no log: one run logs its config to every logger that records one (wandb offline,
MLflow, JSONL, in-memory, TensorBoard) and writes a checkpoint; values of secret-looking keys and credentials
inside URLs appear in none of the files written, nor on the console."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.distributed.helpers import worker_env
from tests.helpers import make_trainer
from tests.launch.launch_helpers import llmfoundry
from tests.planted_secrets import leaks, plant
from tests.train.test_logger_keys import file_store, mlflow_runs, offline_run  # noqa: F401  (file_store: a fixture)

SECRETS = {
    "hf_token": "hf_" + "t" * 30,  # a secret-looking key
    "notes_url": "https://someone:ghtoken0123456789@example.com/notes",  # user:password in a URL
    "data_url": "s3://AKIDEXAMPLE:wJalr/XUtnFEMI+K7MDENG@minio.local/bucket/data",  # a secret key holding / and +
    "share_link": "https://example.com/run?id=7&X-Amz-Signature=f00dfeedcafe1234",  # a signed URL
    "webhook": "https://hooks.example.com/x?token=tok-998877665544",
}
VALUES = ["t" * 30, "ghtoken0123456789", "wJalr/XUtnFEMI+K7MDENG", "f00dfeedcafe1234", "tok-998877665544"]


def test_no_logger_and_no_checkpoint_records_a_secret_of_the_recipe(recipe, tmp_path, monkeypatch, capfd,
                                                                      file_store):  # noqa: F811
    monkeypatch.setenv("WANDB_MODE", "offline")
    loggers = {"wandb": {"project": "secrets", "dir": str(tmp_path)},
               "mlflow": {"tracking_uri": file_store, "experiment_name": "secrets", "synchronous": True,
                          "log_system_metrics": False},
               "jsonl": {"path": str(tmp_path / "metrics.jsonl")}, "inmemory": {},
               "tensorboard": {"log_dir": str(tmp_path / "tb")}}
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", save_interval="2ba", log_to_console=True,
                                  save_folder=str(tmp_path / "ckpt"), metadata=dict(SECRETS), loggers=loggers))
    trainer.fit()
    offline_run(tmp_path)  # wandb has written its run file
    console = capfd.readouterr()
    memory = next(logger for logger in trainer.loggers if hasattr(logger, "hyperparameters"))
    assert memory.hyperparameters["notes_url"] == "https://********@example.com/notes"
    assert memory.hyperparameters["data_url"] == "s3://********@minio.local/bucket/data"
    assert memory.hyperparameters["share_link"] == "https://example.com/run?id=7&X-Amz-Signature=********"
    _, (run,) = mlflow_runs(file_store, "secrets")
    assert run.data.params["hf_token"] == "********"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written) and any("tfevents" in p.name for p in written)
    assert any(p.name == "config.yaml" for p in written) and (tmp_path / "metrics.jsonl").is_file()
    for path in written:
        data = path.read_bytes()
        leaked = [value for value in VALUES if value.encode() in data]
        assert not leaked, f"{path} holds {leaked}"
    assert not [value for value in VALUES if value in console.out + console.err]


def _cli(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "llmfoundry.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _planted_env(planted):
    env = dict(worker_env(), WANDB_MODE="offline", **planted.env)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        env.pop(name, None)
    return env


def test_a_token_given_any_way_reaches_no_file_the_run_writes_nor_its_console(recipe, tmp_path):
    """`llmfoundry train` with a token as an override, a recipe value, an ${oc.env:...} interpolation, an environment
    variable and a URL credential, logging to wandb (offline), MLflow, TensorBoard, JSONL and the console, with a
    profiler trace and checkpoints: no byte of any token in any file, nor on stdout/stderr."""
    planted = plant()
    run = tmp_path / "run"
    loggers = {"wandb": {"project": "planted", "dir": str(run)},
               "mlflow": {"tracking_uri": f"file:{run / 'mlruns'}", "experiment_name": "planted",
                          "synchronous": True, "log_system_metrics": False},
               "jsonl": {"path": str(run / "metrics.jsonl")}, "tensorboard": {"log_dir": str(run / "tb")}}
    profiler = {"schedule": {"wait": 0, "warmup": 0, "active": 1, "repeat": 1},
                "torch_prof_folder": str(run / "traces")}
    path = tmp_path / "planted.yaml"  # the user's own file: the one place the tokens may be
    run.mkdir()
    path.write_text(yaml.safe_dump(planted.recipe(recipe(
        eval_loader=None, max_duration="2ba", save_interval="2ba", log_to_console=True, console_log_interval="1ba",
        progress_bar=True, save_folder=str(run / "ckpt"), loggers=loggers, profiler=profiler,
        callbacks={"env_logging": {}})), sort_keys=False))
    result = _cli(["train", str(path), *planted.overrides], run, _planted_env(planted))
    assert result.returncode == 0, result.stderr[-3000:]
    written = {p.name for p in run.rglob("*") if p.is_file()}
    # every sink wrote something, so that finding nothing means something
    assert any(name.endswith(".wandb") for name in written) and any("tfevents" in name for name in written)
    assert any(name.endswith(".trace.json") for name in written) and "metrics.jsonl" in written
    assert (run / "mlruns").is_dir() and (run / "ckpt" / "ep0-ba2").is_dir()
    (wandb_file,) = run.glob("wandb/offline-run-*/run-*.wandb")
    assert b"+variables.hf_token=********" in wandb_file.read_bytes()  # wandb records the command line, masked
    assert "********" in (run / "metrics.jsonl").read_text()  # the masked values are there, masked
    assert not leaks(planted.tokens.values(), run, texts={"stdout": result.stdout, "stderr": result.stderr})


def test_a_recipe_error_quoting_a_secret_and_check_output_show_it_masked(recipe, tmp_path, monkeypatch):
    """In this process (the command line's own masking is the run test's): the one-line error that quotes the
    value, and everything `llmfoundry check` prints."""
    planted = plant()
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump(planted.recipe(recipe()), sort_keys=False))
    for name, value in planted.env.items():
        monkeypatch.setenv(name, value)
    work = tmp_path / "work"
    work.mkdir()
    bad = llmfoundry(["train", str(path), *planted.overrides, "max_duration=${oc.env:HF_TOKEN}"], work)
    assert bad.returncode == 2 and "max_duration" in bad.stderr and "********" in bad.stderr, bad.stderr
    check = llmfoundry(["check", str(path), *planted.overrides], work)
    assert check.returncode == 0, check.stderr
    texts = {"train stdout": bad.stdout, "train stderr": bad.stderr, "check stdout": check.stdout,
             "check stderr": check.stderr}
    assert not leaks(planted.tokens.values(), work, texts=texts)
