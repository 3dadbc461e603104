"""core/fsspec_store.FsspecClient answers objectstore's S3 calls with S3's meaning, on each store it serves:
gs:// (gcp-storage-emulator) and Azure (Azurite)."""

from __future__ import annotations

import pytest

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.fsspec_store import translated
from llmfoundry.train.checkpointer import stage_model_path


def test_listing_heads_and_deletes_mean_what_they_mean_on_s3(fsspec_store):
    client = objectstore.client_for(fsspec_store)
    bucket = fsspec_store.split("://", 1)[1]
    for key in ("runs/a/ep0-ba4/rank0.pt", "runs/a/ep0-ba4/.complete", "runs/ab/x", "g/a[1]", "g/a1"):
        client.put_object(Bucket=bucket, Key=key, Body=b"1")

    def listed(prefix):
        return [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for item in page["Contents"]]

    # S3's prefix rule: a partial name matches, and runs/a does not stop at a "folder"
    assert listed("runs/a/ep0-b") == ["runs/a/ep0-ba4/.complete", "runs/a/ep0-ba4/rank0.pt"]
    assert listed("runs/a") == ["runs/a/ep0-ba4/.complete", "runs/a/ep0-ba4/rank0.pt", "runs/ab/x"]
    assert listed("nothing/") == []
    assert client.list_objects_v2(Bucket=bucket, Prefix="runs/", MaxKeys=1) == {"Contents": []}  # a probe lists nothing

    folder = objectstore.ObjectFolder(f"{fsspec_store}/runs/a", stores=objectstore.CHECKPOINT_STORES)
    assert folder.exists("ep0-ba4", ".complete") and not folder.exists("ep0-ba4")  # a prefix is no object
    assert folder.read_text("ep0-ba4", ".complete") == "1" and folder.read_text("missing") is None

    # keys are literal (no glob), and a key already gone is no error, as in DeleteObjects
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "g/a[1]"}, {"Key": "g/gone"}]})
    assert listed("g/") == ["g/a1"]


def test_a_missing_bucket_and_a_store_where_training_is_not_the_reader_are_one_line_errors(fsspec_store):
    scheme = fsspec_store.split("://", 1)[0]
    where, setting = {"gs": (objectstore.gcs_emulator(), "STORAGE_EMULATOR_HOST"),
                      "azure": (objectstore.azure.endpoint(), "AZURE_STORAGE_CONNECTION_STRING")}[scheme]
    url = f"{scheme}://no-such-bucket/x"
    for attempt in (lambda: objectstore.ObjectFolder(url, stores=objectstore.CHECKPOINT_STORES).probe(),
                    lambda: objectstore.ObjectFolder(url, stores=objectstore.CHECKPOINT_STORES).list_keys(),
                    lambda: objectstore.write_bytes(f"{url}/y", b"1", stores=objectstore.CHECKPOINT_STORES)):
        with pytest.raises(Exception) as missing:
            attempt()
        assert str(objectstore.explain(missing.value, url, "save_folder")) == (
            f"save_folder: bucket 'no-such-bucket' does not exist at {where} (create it, or check the name and "
            f"{setting})")
    with pytest.raises(ConfigError, match=r"^MODEL: bucket 'no-such-bucket' does not exist at "):
        stage_model_path(f"{url}/ck", "MODEL")  # convert, eval, generate read models from every store too


@pytest.mark.parametrize("scheme, error, code", [
    ("gs", OSError("Forbidden: b/x"), "AccessDenied"),  # gcsfs raises a 403 as a plain OSError
    ("azure", type("HttpResponseError", (Exception,), {"status_code": 403, "error_code": "AuthorizationFailure"})(
        "Server failed to authenticate the request."), "AccessDenied"),
    ("azure", type("ResourceNotFoundError", (Exception,), {"status_code": 404, "error_code": "ContainerNotFound"})(
        "The specified container does not exist."), "NoSuchBucket"),
])
def test_a_stores_refusal_reads_as_botocores(scheme, error, code):
    from llmfoundry.core import azure, gcs

    store = {"gs": gcs.GCS, "azure": azure.AZURE}[scheme]
    shaped = translated(store, error, "bucket", "x")
    assert objectstore.error_code(shaped) == code
    if code == "AccessDenied":
        credentials = {"gs": "GOOGLE_APPLICATION_CREDENTIALS", "azure": "AZURE_STORAGE_CONNECTION_STRING"}[scheme]
        assert f"was refused (AccessDenied); check {credentials}" in str(
            objectstore.explain(shaped, f"{scheme}://bucket/x", "save_folder"))


def test_empty_listings_look_the_bucket_up_once(fsspec_store):
    """The upload loop polls listings that are empty at first: the bucket (which tells a missing bucket from an
    empty prefix) is looked up once, not at every poll."""
    folder = objectstore.ObjectFolder(f"{fsspec_store}/polled", stores=objectstore.CHECKPOINT_STORES)
    client = folder.client
    bucket = fsspec_store.split("://", 1)[1]
    lookups = []
    info = client.fs.info  # fsspec's sync wrapper, an attribute of the (process-wide, cached) instance: put back
    client.fs.info = lambda path, **kw: (lookups.append(path), info(path, **kw))[1]
    try:
        for _ in range(3):
            assert folder.list_keys("ep0-ba2") == []
    finally:
        client.fs.info = info
    assert lookups.count(bucket) <= 1
