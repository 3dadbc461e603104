"""Transfers (#31): a download fetches several objects at once, a delete sends one request per thousand keys (S3's
limit), a checkpoint's completion marker is deleted before anything else, and a failed part of an upload is sent
again alone (a moto S3 server; the client's own event hooks, or a proxy, count the requests)."""

from __future__ import annotations

import threading
import time
from urllib.parse import parse_qs, urlparse

import boto3

from llmfoundry.core import objectstore
from llmfoundry.train import uploads
from llmfoundry.train.uploads import COMPLETE, RemoteCheckpoints
from tests.helpers import S3_TEST_BUCKET
from tests.http_fault_proxy import FaultProxy


def _put(s3_server, files: dict[str, bytes]) -> None:
    store = boto3.client("s3", endpoint_url=s3_server)
    for name, data in files.items():
        store.put_object(Bucket=S3_TEST_BUCKET, Key=name, Body=data)


def _requests(folder: objectstore.ObjectFolder, operation: str, pause_s: float = 0.0) -> dict:
    """Counts of ``operation`` requests on the folder's client, with the largest number in flight at once and
    the keys each carried; ``pause_s`` holds every request that long, so that overlapping requests do overlap."""
    seen = {"calls": [], "in_flight": 0, "most_in_flight": 0}
    lock = threading.Lock()

    def asked(params, **_):  # the operation's API parameters, before they are serialised
        with lock:
            seen["calls"].append(dict(params))

    def before(**_):
        with lock:
            seen["in_flight"] += 1
            seen["most_in_flight"] = max(seen["most_in_flight"], seen["in_flight"])
        time.sleep(pause_s)

    def after(**_):
        with lock:
            seen["in_flight"] -= 1

    folder.client.meta.events.register(f"before-parameter-build.s3.{operation}", asked)
    folder.client.meta.events.register(f"before-call.s3.{operation}", before)
    folder.client.meta.events.register(f"after-call.s3.{operation}", after)
    return seen


def test_a_download_fetches_several_objects_at_once_and_writes_each_whole(s3_server, tmp_path):
    files = {f"run/ep0-ba4/__{rank}_0.distcp": bytes([rank]) * (1000 + 97 * rank) for rank in range(24)}
    _put(s3_server, {**files, "run/ep0-ba4/.metadata": b"metadata"})
    folder = objectstore.ObjectFolder(f"s3://{S3_TEST_BUCKET}/run")
    gets = _requests(folder, "GetObject", pause_s=0.05)
    local = folder.download("ep0-ba4", tmp_path)
    for name, data in files.items():
        assert (local / name.rsplit("/", 1)[1]).read_bytes() == data
    assert (local / ".metadata").read_bytes() == b"metadata"
    assert sorted(p.name for p in local.iterdir()) == sorted([".metadata", *(n.rsplit("/", 1)[1] for n in files)])
    assert len(gets["calls"]) == 25
    assert gets["most_in_flight"] > 1, "the objects were fetched one at a time"
    assert gets["most_in_flight"] <= objectstore.DOWNLOAD_THREADS
    assert not [t for t in threading.enumerate() if t.name.startswith("s3-download")]  # no thread outlives it


def test_deleting_many_keys_sends_one_request_per_batch(s3_server, monkeypatch):
    """S3 takes 1000 keys per request; a batch of 10 shows the same splitting with 21 keys."""
    monkeypatch.setattr(objectstore, "DELETE_BATCH", 10)
    keys = [f"old/part-{i:05d}" for i in range(21)]
    _put(s3_server, {key: b"" for key in keys})
    folder = objectstore.ObjectFolder(f"s3://{S3_TEST_BUCKET}/old")
    batches = _requests(folder, "DeleteObjects")
    singles = _requests(folder, "DeleteObject")
    folder.delete(folder.list_keys())
    assert [len(call["Delete"]["Objects"]) for call in batches["calls"]] == [10, 10, 1]
    assert singles["calls"] == [] and folder.list_keys() == []


def test_a_checkpoint_loses_its_completion_marker_before_its_files(s3_server):
    names = [f"run/ep0-ba2/__{rank}_0.distcp" for rank in range(3)] + [f"run/ep0-ba2/{COMPLETE}"]
    _put(s3_server, {name: b"x" for name in names})
    folder = RemoteCheckpoints(f"s3://{S3_TEST_BUCKET}/run")
    batches = _requests(folder, "DeleteObjects")
    folder.delete_checkpoint("ep0-ba2")
    sent = [[item["Key"] for item in call["Delete"]["Objects"]] for call in batches["calls"]]
    assert sent[0] == [f"run/ep0-ba2/{COMPLETE}"]  # alone, first: a half-deleted checkpoint is never "complete"
    assert sorted(sent[1]) == sorted(names[:3])
    assert folder.list_keys("ep0-ba2") == []


def test_a_failed_part_is_sent_again_alone_not_the_whole_file(s3_server, monkeypatch, tmp_path):
    """Every PUT path (each part of a multipart upload, each small file) is answered with 503 twice: an upload goes
    through with each part sent three times under one upload id. Starting the file again would give every new
    upload id's parts their own first failures, and never finish (as with botocore's one retry before)."""
    target = urlparse(s3_server)
    proxy = FaultProxy(target.hostname, target.port, failures=2, methods=("PUT",))
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    staged = tmp_path / "hf"
    staged.mkdir()
    big = bytes(range(256)) * (9 * 4096)  # 9 MiB: two parts (boto3 splits at 8 MiB)
    (staged / "model.safetensors").write_bytes(big)
    (staged / "config.json").write_text("{}")
    try:
        uploads.publish_folder(staged, f"s3://{S3_TEST_BUCKET}/export", objectstore.Retry(time.monotonic() + 20),
                               last=("config.json",))
    finally:
        proxy.close()
    parts = {path: count for (method, path), count in proxy.seen.items() if "partNumber=" in path}
    assert len(parts) == 2 and set(parts.values()) == {3}, parts
    assert len({parse_qs(urlparse(path).query)["uploadId"][0] for path in parts}) == 1
    store = boto3.client("s3", endpoint_url=s3_server)
    assert store.get_object(Bucket=S3_TEST_BUCKET, Key="export/model.safetensors")["Body"].read() == big
