"""The retries behind checkpoint uploads: a dropped connection is retried whatever its message quotes; only the
store's own "no such object" answer is final."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from llmfoundry.core import objectstore


def failing_twice(error: Exception):
    calls = []

    def call() -> str:
        calls.append(error)
        if len(calls) <= 2:
            raise error
        return "uploaded"

    return call, calls


def quick_retry() -> objectstore.Retry:
    return objectstore.Retry(time.monotonic() + 30, initial_s=0.001, max_s=0.001)


def test_a_dropped_connection_is_retried_even_when_its_url_holds_404():
    # the port and the checkpoint name both contain "404": neither says that anything is missing
    dropped = EndpointConnectionError(endpoint_url="http://127.0.0.1:40412/bucket/run/ep0-ba404/rank0.pt")
    call, calls = failing_twice(dropped)
    assert quick_retry().call(call) == "uploaded"
    assert len(calls) == 3


def test_no_such_key_is_final():
    missing = ClientError({"Error": {"Code": "NoSuchKey", "Message": "The specified key does not exist."},
                           "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")
    call, calls = failing_twice(missing)
    with pytest.raises(ClientError) as error:
        quick_retry().call(call)
    assert error.value is missing and len(calls) == 1
    assert objectstore.problem(missing) == "not found"
