"""hf_checkpointer exporting to S3 (a moto server on 127.0.0.1) in llm-foundry's layout, and the folder upload
that keeps a half-written export from looking complete."""

from __future__ import annotations

import os
import time

import boto3
import pytest
import torch
from transformers import AutoModelForCausalLM

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.loading import load_model
from llmfoundry.train import uploads
from tests.helpers import S3_TEST_BUCKET as BUCKET
from tests.helpers import make_trainer

pytestmark = pytest.mark.s3


def keys(prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def upload_times(prefix: str) -> dict[str, float]:
    """When the moto server (in this process) stored each object under ``prefix``, relative to ``prefix``."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    bucket = s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[BUCKET]
    return {k[len(prefix):]: bucket.keys[k].last_modified.timestamp() for k in bucket.keys if k.startswith(prefix)}


def test_hf_checkpointer_uploads_llm_foundrys_layout_to_s3_and_the_folders_load(recipe, s3_server, tmp_path):
    staging = tmp_path / "staging"
    model = dict(recipe()["model"], expansion_ratio=4, no_bias=True)  # what transformers' MptForCausalLM can hold
    trainer = make_trainer(recipe(
        eval_loader=None, max_duration="3ba", model=model, run_name="hfrun",
        checkpoint_upload={"staging_folder": str(staging)},
        callbacks={"hf_checkpointer": {"save_folder": f"s3://{BUCKET}/runs/{{run_name}}", "save_interval": "2ba"}}))
    trainer.fit()

    stored = keys("runs/")
    assert {k.split("/")[2] for k in stored} == {"huggingface"}  # s3://bucket/runs/hfrun/huggingface/ba{batch}/
    assert sorted({k.split("/")[3] for k in stored}) == ["ba2", "ba3"]
    for batch in ("ba2", "ba3"):
        files = {k.rsplit("/", 1)[1] for k in stored if k.startswith(f"runs/hfrun/huggingface/{batch}/")}
        assert {"config.json", "model.safetensors", "tokenizer.json", uploads.COMPLETE} <= files, files
        times = upload_times(f"runs/hfrun/huggingface/{batch}/")
        others = [t for name, t in times.items() if name not in ("config.json", uploads.COMPLETE)]
        assert max(others) <= times["config.json"] <= times[uploads.COMPLETE]  # the marker last, config.json before
    assert not list(staging.rglob("*.safetensors"))  # staged exports go once uploaded

    local = objectstore.ObjectFolder(f"s3://{BUCKET}/runs/hfrun/huggingface").download("ba3", tmp_path / "dl")
    hf = AutoModelForCausalLM.from_pretrained(str(local))
    assert next(hf.parameters()).dtype == torch.float32  # llm-foundry's default precision
    ids = torch.tensor([[1, 5, 9, 13]])
    ours = trainer.model.eval()(ids).logits
    torch.testing.assert_close(hf(ids).logits, ours, rtol=1e-4, atol=1e-4)
    loaded, _ = load_model(f"s3://{BUCKET}/runs/hfrun/huggingface/ba3")  # our loaders read it in place too
    torch.testing.assert_close(loaded(ids).logits, ours, rtol=1e-4, atol=1e-4)


def test_hf_checkpointer_folder_name_overwrite_and_a_missing_bucket(recipe, s3_server, tmp_path):
    model = dict(recipe()["model"], expansion_ratio=4, no_bias=True)
    hf = {"save_folder": f"s3://{BUCKET}/named", "save_interval": "1dur", "precision": "bf16",
          "huggingface_folder_name": "{run_name}-ep{epoch}-ba{batch}"}

    def run(**settings):
        return make_trainer(recipe(eval_loader=None, max_duration="1ba", model=model, run_name="r",
                                   checkpoint_upload={"staging_folder": str(tmp_path / "staging")},
                                   callbacks={"hf_checkpointer": dict(hf, **settings)}))

    run().fit()
    assert keys("named/huggingface/r-ep0-ba1/config.json") == ["named/huggingface/r-ep0-ba1/config.json"]
    run().fit()  # overwrite: true by default, as in llm-foundry
    with pytest.raises(ConfigError, match=r"callbacks\.hf_checkpointer\.overwrite: the export 's3://.*/r-ep0-ba1' "
                                          "already exists"):
        run(overwrite=False).fit()
    with pytest.raises(ConfigError, match="callbacks.hf_checkpointer.save_folder: bucket 'no-such-bucket' does not "
                                          "exist"):
        run(save_folder="s3://no-such-bucket/x").fit()


def test_only_hf_checkpoint_to_s3_returns_once_the_export_is_complete(recipe, s3_server, tmp_path):
    model = dict(recipe()["model"], expansion_ratio=4, no_bias=True)
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", model=model, only_hf_checkpoint=True,
                                  checkpoint_upload={"staging_folder": str(tmp_path / "staging")},
                                  callbacks={"hf_checkpointer": {"save_folder": f"s3://{BUCKET}/only"}}))
    trainer.fit()
    assert trainer.time.batch == 0
    assert f"only/huggingface/ba0/{uploads.COMPLETE}" in keys("only/")


def _folder(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_publish_folder_replaces_an_old_copy_with_the_marker_last(s3_server, tmp_path):
    url = f"s3://{BUCKET}/exports/m"
    retry = objectstore.Retry(time.monotonic() + 60)
    old = _folder(tmp_path / "old", {"config.json": "old", "a.bin": "old", "stale.bin": "old", "sub/t.json": "old"})
    uploads.publish_folder(old, url, retry, last=("config.json",))
    new = _folder(tmp_path / "new", {"config.json": "new", "a.bin": "new", "sub/t.json": "new"})
    assert uploads.publish_folder(new, url, retry, last=("config.json",)) == ["a.bin", "config.json", "sub/t.json"]

    assert keys("exports/m/") == ["exports/m/.complete", "exports/m/a.bin", "exports/m/config.json",
                                  "exports/m/sub/t.json"]  # the old copy's stale file is gone
    folder = objectstore.ObjectFolder(url)
    assert folder.read_text("config.json") == "new" and folder.read_text("sub/t.json") == "new"
    times = upload_times("exports/m/")
    assert max(times["a.bin"], times["sub/t.json"]) <= times["config.json"] <= times[uploads.COMPLETE]
