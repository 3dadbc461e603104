"""`llmfoundry convert` outputs: an s3:// OUT_DIR (a moto server on 127.0.0.1), --hf_repo_for_upload and
--test_uploaded_model (a file:// folder stands in for the Hub; without network the Hub flags fail up front)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import boto3
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from llmfoundry.cli import main as cli
from llmfoundry.commands.convert_run import check_uploaded_model, upload_model
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import export_hf
from llmfoundry.train import uploads
from tests.helpers import S3_TEST_BUCKET as BUCKET
from tests.models.helpers import tiny_model


@pytest.fixture
def source(tmp_path, tokenizer):
    """A model folder of ours (MPTForCausalLM.save_pretrained + tokenizer), what convert reads."""
    folder = tmp_path / "ours"
    tiny_model(learned_pos_emb=False, attn_config={"alibi": True}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _logits(path) -> torch.Tensor:
    return AutoModelForCausalLM.from_pretrained(str(path)).eval()(torch.tensor([[1, 5, 9, 13]])).logits


@pytest.mark.s3
def test_convert_writes_to_s3_and_uploads_to_a_folder_target(source, s3_server, tmp_path,
                                                                                   own_staging_dir, capsys):
    url = f"s3://{BUCKET}/exports/tiny"
    hub = tmp_path / "hub"
    assert cli(["convert", str(source), url, "--hf_repo_for_upload", f"file://{hub}", "--test_uploaded_model"]) == 0
    out = capsys.readouterr().out
    assert f"wrote MptForCausalLM (fp32) to {url}" in out and "matches the export" in out

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    stored = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="exports/tiny/")["Contents"]}
    assert {"exports/tiny/config.json", "exports/tiny/model.safetensors", "exports/tiny/tokenizer.json",
            f"exports/tiny/{uploads.COMPLETE}"} <= stored
    assert not list(own_staging_dir.rglob("*.safetensors"))  # the staging copy goes once uploaded

    assert cli(["convert", str(source), str(tmp_path / "local")]) == 0
    downloaded = objectstore.ObjectFolder(f"s3://{BUCKET}/exports").download("tiny", tmp_path / "dl")
    torch.testing.assert_close(_logits(downloaded), _logits(tmp_path / "local"), rtol=0, atol=0)
    torch.testing.assert_close(_logits(hub), _logits(tmp_path / "local"), rtol=0, atol=0)


@pytest.mark.s3
def test_convert_to_a_missing_bucket_fails_before_loading(s3_server, tmp_path, capsys):
    assert cli(["convert", str(tmp_path / "missing"), "s3://no-such-bucket/x"]) == 2
    assert capsys.readouterr().err.startswith("error: OUT_DIR: bucket 'no-such-bucket' does not exist")


def test_hub_upload_without_network_is_one_line_before_the_model_is_loaded(source, tmp_path, capsys):
    out = tmp_path / "out"
    for checkpoint in (tmp_path / "missing", source):  # a missing checkpoint is not even looked at
        start = time.monotonic()
        assert cli(["convert", str(checkpoint), str(out), "--hf_repo_for_upload", "me/tiny"]) == 2
        assert time.monotonic() - start < 5
        err = capsys.readouterr().err
        assert err == ("error: --hf_repo_for_upload: the Hugging Face Hub cannot be reached: HF_HUB_OFFLINE is set "
                       "(run on a machine with network access and HF_HUB_OFFLINE unset, or upload OUT_DIR later)\n")
        assert not out.exists()
    assert cli(["convert", str(source), str(out), "--hf_repo_for_upload", "not a repo!"]) == 2
    assert capsys.readouterr().err.startswith("error: --hf_repo_for_upload: 'not a repo!' is not a Hugging Face "
                                              "repo id")
    assert cli(["convert", str(source), str(out), "--test_uploaded_model"]) == 2
    assert capsys.readouterr().err.startswith("error: --test_uploaded_model: there is no uploaded model to test")
    assert not out.exists()


def test_hub_upload_to_an_unreachable_endpoint_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: the Hub "cannot be reached"
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN="hf_not_a_token")
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "convert", str(tmp_path / "missing"),
                             str(tmp_path / "out"), "--hf_repo_for_upload", "me/tiny"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip()
    assert "\n" not in err and "hf_not_a_token" not in err
    assert err.startswith(f"error: --hf_repo_for_upload: the Hugging Face Hub at http://127.0.0.1:{port} did not "
                          "accept the token or cannot be reached ("), err
    assert not (tmp_path / "out").exists()


def test_upload_model_to_a_folder_target_and_the_uploaded_model_check(tmp_path, tokenizer):
    export = tmp_path / "export"
    export_hf(tiny_model(learned_pos_emb=False, attn_config={"alibi": True}), tokenizer, export, "bf16")
    where = upload_model(export, f"file://{tmp_path / 'mirror'}")
    assert where == str(tmp_path / "mirror")
    assert sorted(p.name for p in export.iterdir()) == sorted(p.name for p in (tmp_path / "mirror").iterdir())
    check_uploaded_model(export, where, "bf16")

    weights = load_file(tmp_path / "mirror" / "model.safetensors")  # an upload that went wrong
    name = next(iter(weights))
    weights[name] = weights[name] + 1
    save_file(weights, tmp_path / "mirror" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="--test_uploaded_model: the model loaded from .* differs from the export"):
        check_uploaded_model(export, where, "bf16")
