"""Conversion straight to a real S3 endpoint (moto) and streaming back from it."""

from __future__ import annotations

import json

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.text import build_text_dataloader
from tests.helpers import S3_TEST_BUCKET as BUCKET
from tests.helpers import batch_rows

pytestmark = pytest.mark.s3


def remote_loader(remote, tokenizer, **dataset):
    settings = TextLoaderSettings(dataset=TextDatasetSettings(remote=remote, split="train", max_seq_len=32,
                                                              shuffle=True, shuffle_seed=11, **dataset))
    return build_text_dataloader(settings, tokenizer, 4)


def test_jsonl_to_s3_mds_streams_back_and_resumes_exactly(s3_server, tmp_path, corpus, tokenizer_dir, tokenizer,
                                                          monkeypatch):
    import boto3

    from llmfoundry.data.prep.cli import main

    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": doc}) for doc in corpus))
    remote = f"s3://{BUCKET}/mds"
    assert main(["json", "--path", str(jsonl), "--out_root", remote, "--split", "train", "--concat_tokens", "32",
                 "--tokenizer", str(tokenizer_dir), "--num_workers", "1", "--quiet"]) == 0
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "mds/train/index.json" in keys and any(k.endswith(".mds.zstd") for k in keys)

    full = batch_rows(remote_loader(remote, tokenizer))
    assert len(full) > 40
    first = remote_loader(remote, tokenizer)
    it = iter(first)
    seen = [tuple(r) for _ in range(5) for r in next(it)["input_ids"].tolist()]
    state = first.state_dict()
    del it, first  # "kill" the loader
    resumed = remote_loader(remote, tokenizer)
    resumed.load_state_dict(state)
    assert seen == full[:20]
    assert batch_rows(resumed) == full[20:]


def test_missing_remote_prefix_is_a_config_error(s3_server, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"train_loader\.dataset.*s3://llmfoundry-test/missing-prefix.*convert"):
        remote_loader(f"s3://{BUCKET}/missing-prefix", tokenizer)


def test_finetuning_converter_local_keeps_a_copy_of_a_remote_output(s3_server, tmp_path, corpus, tokenizer_dir):
    import boto3

    from llmfoundry.data.prep.finetuning import main

    path = tmp_path / "pr.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": d[:40], "response": d[40:80]}) for d in corpus[:20]))
    assert main(["--dataset", str(path), "--out_root", f"s3://{BUCKET}/ft", "--local", str(tmp_path / "copy"),
                 "--tokenizer", str(tokenizer_dir), "--max_seq_len", "64", "--splits", "train", "--num_workers", "1"]) == 0
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "ft/train/index.json" in keys
    local = json.loads((tmp_path / "copy" / "train" / "index.json").read_text())
    assert sum(s["samples"] for s in local["shards"]) == 20


def test_mds_data_on_a_store_streams_through_our_storage_layer_like_local_data(fsspec_store, mds_root, tmp_path,
                                                                              tokenizer, monkeypatch):
    """streaming downloads gs:// and azure:// shards with our client (the emulators here; google-auth's chain or the
    AZURE_STORAGE_* variables for the real stores), and the batches are those of the same shards read locally; a
    missing prefix is the same one-line error as on S3."""
    import re

    from tests.helpers import upload_split

    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    remote = f"{fsspec_store}/mds"
    upload_split(mds_root, "train", remote)
    assert batch_rows(remote_loader(remote, tokenizer)) == batch_rows(remote_loader(None, tokenizer, local=str(mds_root)))
    with pytest.raises(ConfigError, match=rf"train_loader\.dataset.*{re.escape(fsspec_store)}/missing.*index\.json"):
        remote_loader(f"{fsspec_store}/missing", tokenizer)


def test_mds_data_on_oci_streams_through_our_s3_client_in_either_url_form(oci_server, mds_root, tmp_path, tokenizer,
                                                                          monkeypatch):
    """streaming's own OCI downloader needs the oci SDK and an API signing key; ours reads the shards through OCI's
    S3 compatibility API (the stand-in here), as checkpoints do. ``oci://bucket@namespace/...`` (streaming's form)
    names the same objects."""
    from tests.helpers import OCI_TEST_BUCKET, upload_split

    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    upload_split(mds_root, "train", f"oci://{OCI_TEST_BUCKET}/mds")
    local = batch_rows(remote_loader(None, tokenizer, local=str(mds_root)))
    assert batch_rows(remote_loader(f"oci://{OCI_TEST_BUCKET}@testns/mds", tokenizer)) == local
    assert oci_server.refused == []
    with pytest.raises(ConfigError, match=rf"train_loader\.dataset.*oci://{OCI_TEST_BUCKET}/missing.*index\.json"):
        remote_loader(f"oci://{OCI_TEST_BUCKET}/missing", tokenizer)
