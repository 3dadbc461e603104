"""Reads at resume go through a storm of 503 SlowDown: every object, and every listing, answered with 503 three
times before the store answers (tests/http_fault_proxy.py in front of moto)."""

from __future__ import annotations

import os
import time
from urllib.parse import urlparse

import boto3
import pytest

from llmfoundry.train.uploads import COMPLETE, LATEST, RemoteCheckpoints, resolve_remote
from tests.helpers import AZURE_TEST_CONTAINER, S3_TEST_BUCKET
from tests.http_fault_proxy import FaultProxy

FILES = {"ep0-ba2/rank0.pt": b"first checkpoint", "ep0-ba4/rank0.pt": b"weights" * 100,
         "ep0-ba4/.metadata": b"metadata", f"ep0-ba2/{COMPLETE}": b"", f"ep0-ba4/{COMPLETE}": b"", LATEST: b"ep0-ba4"}


@pytest.fixture
def storm(s3_server, monkeypatch):
    store = boto3.client("s3", endpoint_url=s3_server)
    for name, data in FILES.items():
        store.put_object(Bucket=S3_TEST_BUCKET, Key=f"run/{name}", Body=data)
    target = urlparse(s3_server)
    proxy = FaultProxy(target.hostname, target.port, failures=3)
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    yield proxy
    proxy.close()


def test_a_resume_reads_through_repeated_503s(storm, tmp_path):
    folder, name = resolve_remote(f"s3://{S3_TEST_BUCKET}/run")
    assert name == "ep0-ba4"
    local = folder.download_checkpoint(name, tmp_path)
    assert (local / "rank0.pt").read_bytes() == FILES["ep0-ba4/rank0.pt"]
    assert (local / ".metadata").read_bytes() == b"metadata" and not (local / COMPLETE).exists()
    for name in ("rank0.pt", ".metadata"):  # three 503s, then the object
        assert storm.seen[("GET", f"/{S3_TEST_BUCKET}/run/ep0-ba4/{name}")] == 4
    # the listing's three 503s are always ours to retry; s3transfer (>= 0.19) asks again itself within a download
    assert folder.retries >= 3 and storm.answered_with_errors >= 9


def test_past_its_deadline_a_read_fails_with_the_stores_answer(storm, monkeypatch):
    monkeypatch.setenv("LLMFOUNDRY_S3_READ_DEADLINE", "0.05")  # no time to ask again
    with pytest.raises(Exception, match="SlowDown|503"):
        RemoteCheckpoints(f"s3://{S3_TEST_BUCKET}/run").latest()



@pytest.fixture
def azure_storm(azure_server, monkeypatch):
    """Azurite holding FILES under run/, reached through a proxy answering 503 to the first GET and HEAD of every
    path. (benchmarks/chaos.py's stores rows run 5 per object through whole training runs, on every store.)"""
    from llmfoundry.core import objectstore

    root = f"azure://{AZURE_TEST_CONTAINER}/run"
    for name, data in FILES.items():
        objectstore.write_bytes(f"{root}/{name}", data, stores=objectstore.CHECKPOINT_STORES)
    connection = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    target = urlparse(azure_server)
    proxy = FaultProxy(target.hostname, target.port, failures=1)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       connection.replace(f"{target.scheme}://{target.netloc}", proxy.url))
    yield root, proxy
    proxy.close()


def test_a_resume_on_azure_reads_through_503s_within_seconds(azure_storm, tmp_path):
    root, proxy = azure_storm
    started = time.monotonic()
    folder, name = resolve_remote(root)
    assert name == "ep0-ba4"
    local = folder.download_checkpoint(name, tmp_path)
    assert (local / "rank0.pt").read_bytes() == FILES["ep0-ba4/rank0.pt"]
    assert (local / ".metadata").read_bytes() == b"metadata"
    assert proxy.answered_with_errors >= 4
    # azure-storage's own wait (15 s before asking again) made a resume take a minute per object in a storm
    assert time.monotonic() - started < 15
