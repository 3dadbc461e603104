"""Folders and buckets someone else writes: a listing with keys that would land outside the staging folder is
refused before anything is downloaded (moto S3 server), and a model folder that needs its own Python code says so
in one line instead of running it."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.loading import load_model
from llmfoundry.train.checkpointer import resolve_load_path
from tests.helpers import S3_TEST_BUCKET

ESCAPES = {
    "parent folders": "ckpt/ep0-ba2/../../../../escaped.txt",
    "an absolute path": "ckpt/ep0-ba2//tmp/llmfoundry-escaped-absolute.txt",
    "a dot part": "ckpt/ep0-ba2/./x/../../escaped.txt",
}


@pytest.mark.s3
@pytest.mark.parametrize("kind", list(ESCAPES))
def test_a_checkpoint_listing_with_a_key_escaping_the_staging_folder_is_refused(s3_server, tmp_path, kind):
    s3 = boto3.client("s3", endpoint_url=s3_server)
    for key in ("ckpt/ep0-ba2/.complete", "ckpt/ep0-ba2/rank0.pt", ESCAPES[kind]):
        s3.put_object(Bucket=S3_TEST_BUCKET, Key=key, Body=b"planted")
    assert ESCAPES[kind] in [o["Key"] for o in s3.list_objects_v2(Bucket=S3_TEST_BUCKET)["Contents"]]
    staging = tmp_path / "deep" / "er" / "staging"
    with pytest.raises(ConfigError, match="would be written outside the local staging folder") as refused:
        resolve_load_path(f"s3://{S3_TEST_BUCKET}/ckpt", staging)
    assert "\n" not in str(refused.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing downloaded, not even the good files
    assert not Path("/tmp/llmfoundry-escaped-absolute.txt").exists()


@pytest.mark.s3
def test_a_latest_pointer_naming_a_folder_outside_the_save_folder_is_refused(s3_server, tmp_path):
    s3 = boto3.client("s3", endpoint_url=s3_server)
    for key, body in {"ckpt/latest": b"../outside\n", "ckpt/../outside/.complete": b"",
                      "ckpt/../outside/rank0.pt": b"planted"}.items():
        s3.put_object(Bucket=S3_TEST_BUCKET, Key=key, Body=body)
    staging = tmp_path / "staging"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("a file the download must not delete")
    with pytest.raises(ConfigError, match="'../outside' would be written outside"):
        resolve_load_path(f"s3://{S3_TEST_BUCKET}/ckpt", staging)
    assert (tmp_path / "outside" / "keep.txt").is_file()


def test_a_model_folder_that_needs_its_own_code_says_so_and_runs_nothing(tmp_path):
    folder = tmp_path / "custom"
    folder.mkdir()
    marker = tmp_path / "code-ran"
    (folder / "config.json").write_text(json.dumps({
        "model_type": "my_custom_lm",
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig",
                     "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}}))
    for name in ("configuration_custom.py", "modeling_custom.py"):
        (folder / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    with pytest.raises(ConfigError, match=r"needs its own Python code to load \(its config.json has auto_map\), "
                                          r"which is not run unless model.trust_remote_code: true") as refused:
        load_model(folder)
    assert "\n" not in str(refused.value)
    assert not marker.exists()


@pytest.fixture
def silent_endpoint(monkeypatch):
    """An S3 endpoint that accepts connections and never answers (a hung store or proxy)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    for name, value in {"S3_ENDPOINT_URL": url, "AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    yield url
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def test_a_store_that_never_answers_is_an_error_within_the_read_timeout(silent_endpoint, tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("LLMFOUNDRY_S3_READ_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"load_path: cannot reach 's3://bucket/ckpt' at .*[Rr]ead timeout") as error:
        resolve_load_path("s3://bucket/ckpt", tmp_path / "staging")
    assert time.monotonic() - started < 15 and "\n" not in str(error.value)


def test_an_object_store_timeout_that_is_not_a_number_is_a_one_line_error(monkeypatch):
    from llmfoundry.core import objectstore

    monkeypatch.setenv("LLMFOUNDRY_S3_READ_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="LLMFOUNDRY_S3_READ_TIMEOUT: 'soon' is not a number of seconds"):
        objectstore.client()
