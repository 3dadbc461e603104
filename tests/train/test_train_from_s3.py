"""The whole remote path: JSONL -> MDS on an S3 endpoint (moto) -> a training run that streams from it."""

from __future__ import annotations

import json
import math

import boto3
import pytest

from llmfoundry.data.prep.cli import main as data_main
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.trainer import Trainer

pytestmark = pytest.mark.s3


def test_training_streams_its_data_from_s3(s3_server, recipe, corpus, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": doc}) for doc in corpus))
    remote = "s3://llmfoundry-test/mds"
    assert data_main(["json", "--path", str(jsonl), "--out_root", remote, "--split", "train", "--concat_tokens", "64",
                      "--tokenizer", str(tokenizer_dir), "--num_workers", "1", "--quiet"]) == 0

    loader = {"name": "text", "drop_last": True,
              "dataset": {"remote": remote, "split": "train", "shuffle": True, "shuffle_seed": 3, "max_seq_len": 64}}
    cfg = recipe(train_loader=loader, eval_loader=None, max_duration="6ba", eval_first=False,
                 save_folder="s3://llmfoundry-test/run", save_interval="3ba")
    trainer = Trainer(validate(cfg, TrainConfig), cfg)
    metrics = trainer.fit()
    assert trainer.time.batch == 6 and trainer.time.sample == 48
    assert math.isfinite(metrics["loss/train/total"])
    s3 = boto3.client("s3", endpoint_url=s3_server)
    latest = s3.get_object(Bucket="llmfoundry-test", Key="run/latest")["Body"].read().decode().strip()
    assert latest == "ep0-ba6"
