"""Secrets in a recipe reach no log: one run logs its config to every logger that records one (wandb offline,
MLflow, JSONL, in-memory, TensorBoard) and writes a checkpoint; values of secret-looking keys and credentials
inside URLs appear in none of the files written, nor on the console."""

from __future__ import annotations

from tests.helpers import make_trainer
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
