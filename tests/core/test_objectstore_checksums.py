"""Uploads to an S3-compatible store (S3_ENDPOINT_URL set) carry no CRC checksum headers: boto3 >= 1.36 adds them
to every upload by default, and several such stores (B2, Ceph, OCI's S3 API, some MinIO versions) reject them."""

from __future__ import annotations

import boto3

from llmfoundry.core import objectstore
from tests.helpers import S3_TEST_BUCKET


def _checksum_headers_of_a_put(s3) -> list[str]:
    sent: list[str] = []

    def record(request, **_):
        sent.extend(name.lower() for name in request.headers if name.lower().startswith(("x-amz-checksum",
                                                                                            "x-amz-sdk-checksum")))

    s3.meta.events.register("before-send.s3.PutObject", record)
    s3.put_object(Bucket=S3_TEST_BUCKET, Key="x.bin", Body=b"0123456789")
    return sent


def test_uploads_to_an_s3_compatible_endpoint_send_no_checksum_headers(s3_server):
    assert _checksum_headers_of_a_put(objectstore.client()) == []
    # what boto3 does by default, against the same server: the headers the stores above reject
    assert _checksum_headers_of_a_put(boto3.client("s3", endpoint_url=s3_server)) != []
