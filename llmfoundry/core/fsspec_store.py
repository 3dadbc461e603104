"""An fsspec filesystem answering the few S3 client calls core/objectstore.py makes: one adapter for every store
that is not S3 (``gs://`` through gcsfs, core/gcs.py; Azure Blob Storage through adlfs, core/azure.py).

objectstore's folders, uploads and whole-file helpers were written against boto3's S3 client; :class:`FsspecClient`
gives the same calls (head_object, get_object, list_objects_v2's paginator, download_file, upload_file, put_object,
delete_objects, delete_object) with S3's meanings where the filesystems differ (prefix listing, no object at a
"directory", literal keys on delete, a missing key deletes fine, a missing bucket is NoSuchBucket). So every
protocol built on them (staged uploads, completion markers, ``latest``, retries, parallel downloads, batched
deletes) is the same code for every store. Failures come out shaped like botocore's (``response["Error"]["Code"]``
and the HTTP status), so objectstore's classification (missing, passing server failure, access denied) reads them
unchanged. Each store says how to read a status out of its library's errors (``Store.status``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmfoundry.core.errors import first_line


class StoreError(Exception):
    """A store's refusal in botocore's shape: ``response = {"Error": {"Code": ...}, "ResponseMetadata": ...}``."""

    def __init__(self, code: str, status: int, message: str):
        super().__init__(message)
        self.response = {"Error": {"Code": code, "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


@dataclass(frozen=True)
class Store:
    """What differs between stores: the URL scheme (for messages), the filesystem, and how to read (HTTP status,
    S3 error code or None) out of the library's errors (None: not a store's answer, e.g. a connection failure)."""

    scheme: str  # "gs", "azure"
    filesystem: Callable[[], Any]
    status: Callable[[BaseException], tuple[int, str | None] | None]
    upload_options: tuple[tuple[str, Any], ...] = ()  # extra arguments of put_file / pipe_file


_CODES = {401: "AccessDenied", 403: "AccessDenied", 404: "NoSuchKey", 429: "Throttling"}


def translated(store: Store, error: BaseException, bucket: str, key: str) -> BaseException:
    """The library's error in botocore's shape (FileNotFoundError stays: objectstore reads it as "missing")."""
    found = store.status(error)
    if found is None:
        return error
    status, code = found
    return StoreError(code or _CODES.get(status, str(status)), status,
                      f"{store.scheme}://{bucket}/{key}: {first_line(error)}")


class FsspecClient:
    """The S3 client calls objectstore makes, for one fsspec store (``Bucket`` is its bucket or container)."""

    def __init__(self, store: Store):
        self.store = store
        self.fs = store.filesystem()
        self.meta = _NoEvents()  # objectstore.count_failed_requests hooks botocore's events; fsspec stores retry
        # buckets seen to exist: an empty listing of one is not asked about again (the upload loop polls listings,
        # and a container-scoped SAS may not be allowed to look the container up)
        self._existing: set[str] = set()

    def _call(self, fn, bucket: str, key: str):
        try:
            return fn()
        except FileNotFoundError:
            raise
        except Exception as error:  # noqa: BLE001 - gcsfs's HttpError, azure-core's errors, aiohttp's errors
            converted = translated(self.store, error, bucket, key)
            if converted is error:
                raise
            raise converted from error

    def _no_bucket(self, bucket: str) -> StoreError:
        return StoreError("NoSuchBucket", 404, f"{self.store.scheme}://{bucket}: no such bucket")

    def _bucket_exists(self, bucket: str) -> bool:
        if bucket in self._existing:
            return True
        try:
            self._call(lambda: self.fs.info(bucket), bucket, "")
        except FileNotFoundError:
            return False
        self._existing.add(bucket)
        return True

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        info = self._call(lambda: self.fs.info(f"{Bucket}/{Key}"), Bucket, Key)
        if info.get("type") != "file":  # a "directory" (a prefix of other keys) is no object, as on S3
            raise FileNotFoundError(f"{self.store.scheme}://{Bucket}/{Key}")
        return info

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        data = self._call(lambda: self.fs.cat_file(f"{Bucket}/{Key}"), Bucket, Key)
        return {"Body": _Body(data)}

    def list_objects_v2(self, Bucket: str, Prefix: str = "", MaxKeys: int | None = None) -> dict[str, Any]:
        if MaxKeys is not None:  # objectstore's probe: does the bucket answer (a missing one is NoSuchBucket)?
            if not self._bucket_exists(Bucket):
                raise self._no_bucket(Bucket)
            return {"Contents": []}
        return {"Contents": [{"Key": k} for k in self._list(Bucket, Prefix)]}

    def get_paginator(self, operation: str) -> _Paginator:
        assert operation == "list_objects_v2", operation
        return _Paginator(self)

    def _list(self, bucket: str, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` (S3's prefix rule: ``runs/a/ep0-b`` finds ``runs/a/ep0-ba4/...``)."""
        parent, _, rest = prefix.rpartition("/")
        try:
            found = self._call(lambda: self.fs.find(f"{bucket}/{parent}", prefix=rest), bucket, prefix)
        except FileNotFoundError:
            found = []
        keys = sorted(k for k in (path.split("/", 1)[1] for path in found if "/" in path) if k.startswith(prefix))
        if keys:
            self._existing.add(bucket)
        elif not self._bucket_exists(bucket):  # gcsfs raises for a missing bucket, adlfs lists nothing
            raise self._no_bucket(bucket)
        return keys

    def download_file(self, Bucket: str, Key: str, Filename: str) -> None:
        self._call(lambda: self.fs.get_file(f"{Bucket}/{Key}", Filename), Bucket, Key)

    def _write(self, fn, bucket: str, key: str) -> None:
        try:
            self._call(fn, bucket, key)
        except FileNotFoundError:  # gcsfs and adlfs say so for a write into a missing bucket
            if self._bucket_exists(bucket):
                raise
            raise self._no_bucket(bucket) from None

    def upload_file(self, Filename: str, Bucket: str, Key: str) -> None:
        options = dict(self.store.upload_options)
        self._write(lambda: self.fs.put_file(Filename, f"{Bucket}/{Key}", **options), Bucket, Key)

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        options = dict(self.store.upload_options)
        self._write(lambda: self.fs.pipe_file(f"{Bucket}/{Key}", Body, **options), Bucket, Key)

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        # one request per key, keys taken literally (rm() expands [ ] * ? as patterns) and a key already gone is
        # no error, as in S3's DeleteObjects
        for item in Delete["Objects"]:
            self.delete_object(Bucket=Bucket, Key=item["Key"])
        return {}

    def delete_object(self, Bucket: str, Key: str) -> None:
        try:
            self._call(lambda: self.fs.rm_file(f"{Bucket}/{Key}"), Bucket, Key)
        except FileNotFoundError:
            pass  # as S3: deleting what is not there succeeds


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def read(self) -> bytes:
        return self.data


class _Paginator:
    def __init__(self, client: FsspecClient):
        self.client = client

    def paginate(self, Bucket: str, Prefix: str = ""):
        yield {"Contents": [{"Key": k} for k in self.client._list(Bucket, Prefix)]}


class _NoEvents:
    class events:  # noqa: N801 - botocore's attribute name
        @staticmethod
        def register_first(*args, **kwargs) -> None:
            return None
