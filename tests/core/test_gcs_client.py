"""core/gcs.GCSClient answers objectstore's S3 calls with S3's meaning, on gcp-storage-emulator."""

from __future__ import annotations

import pytest

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.gcs import GCSClient
from llmfoundry.train.checkpointer import stage_model_path
from tests.helpers import GCS_TEST_BUCKET as BUCKET


def test_listing_heads_and_deletes_mean_what_they_mean_on_s3(gcs_server):
    gcs = GCSClient()
    for key in ("runs/a/ep0-ba4/rank0.pt", "runs/a/ep0-ba4/.complete", "runs/ab/x", "g/a[1]", "g/a1"):
        gcs.put_object(Bucket=BUCKET, Key=key, Body=b"1")

    def listed(prefix):
        return [item["Key"] for page in gcs.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
                for item in page["Contents"]]

    # S3's prefix rule: a partial name matches, and runs/a does not stop at a "folder"
    assert listed("runs/a/ep0-b") == ["runs/a/ep0-ba4/.complete", "runs/a/ep0-ba4/rank0.pt"]
    assert listed("runs/a") == ["runs/a/ep0-ba4/.complete", "runs/a/ep0-ba4/rank0.pt", "runs/ab/x"]
    assert gcs.list_objects_v2(Bucket=BUCKET, Prefix="runs/", MaxKeys=1) == {"Contents": []}  # a probe lists nothing

    folder = objectstore.ObjectFolder(f"gs://{BUCKET}/runs/a", stores=(objectstore.GS,))
    assert folder.exists("ep0-ba4", ".complete") and not folder.exists("ep0-ba4")  # a prefix is no object

    # keys are literal (no glob), and a key already gone is no error, as in DeleteObjects
    gcs.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "g/a[1]"}, {"Key": "g/gone"}]})
    assert listed("g/") == ["g/a1"]


def test_a_missing_bucket_and_gs_where_training_is_not_the_reader_are_one_line_errors(gcs_server):
    with pytest.raises(Exception) as missing:
        objectstore.ObjectFolder("gs://no-such-bucket/x", stores=(objectstore.GS,)).probe()
    assert str(objectstore.explain(missing.value, "gs://no-such-bucket/x", "save_folder")) == (
        f"save_folder: bucket 'no-such-bucket' does not exist at {gcs_server} (create it, or check the name and "
        "STORAGE_EMULATOR_HOST)")
    with pytest.raises(ConfigError, match=r"^MODEL: 'gs://b/ck': gs:// object stores are not supported here \(gs:// "
                                          r"works for the top-level save_folder and load_path"):
        stage_model_path("gs://b/ck", "MODEL")  # convert, eval, generate


def test_a_forbidden_answer_reads_as_access_denied():
    from llmfoundry.core.gcs import _translated

    error = _translated(OSError("Forbidden: b/x"), "b", "x")
    assert objectstore.error_code(error) == "AccessDenied"
    assert "was refused (AccessDenied); check GOOGLE_APPLICATION_CREDENTIALS" in str(
        objectstore.explain(error, "gs://b/x", "save_folder"))
