"""``gs://`` through gcsfs (fsspec), answering the few S3 client calls core/objectstore.py makes.

objectstore's folders, uploads and whole-file helpers were written against boto3's S3 client; this class gives
the same calls (head_object, get_object, list_objects_v2's paginator, download_file, upload_file, put_object,
delete_objects, delete_object) for a GCS bucket, so every protocol built on them (staged uploads, completion
markers, ``latest``, retries, parallel downloads, batched deletes) is the same code for both stores. Failures come
out shaped like botocore's (``response["Error"]["Code"]`` and the HTTP status), so objectstore's classification
(missing, passing server failure, access denied) reads them unchanged.

Credentials are google-auth's usual chain (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's login, the metadata
server). ``STORAGE_EMULATOR_HOST`` points every client at an emulator (the tests' gcp-storage-emulator), and then
no credentials are used.
"""

from __future__ import annotations

import os
from typing import Any

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class StoreError(Exception):
    """A store's refusal in botocore's shape: ``response = {"Error": {"Code": ...}, "ResponseMetadata": ...}``."""

    def __init__(self, code: str, status: int, message: str):
        super().__init__(message)
        self.response = {"Error": {"Code": code, "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


def emulator() -> str | None:
    return os.environ.get(EMULATOR_ENV) or None


def _filesystem():
    # gcsfs's bucket-type probe (gRPC, for zonal/hierarchical buckets) waits 60 s where it is not answered (an
    # emulator, a firewall); plain buckets do not need it. Read when gcsfs is first imported.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs  # optional (the gcs extra): only gs:// URLs need it

    # fsspec keeps one instance per process and arguments (credentials are found once; a forked rank makes its
    # own). No listing cache: "latest" and completion markers are read again and again and must be current.
    # consistency="md5": an upload is checked against the store's checksum of what it received.
    return gcsfs.GCSFileSystem(token="anon" if emulator() else None, endpoint_url=emulator(),
                               use_listings_cache=False, consistency="md5")


def _translated(error: BaseException, bucket: str, key: str) -> BaseException:
    """gcsfs's errors in botocore's shape (FileNotFoundError stays: objectstore reads it as "missing")."""
    code = getattr(error, "code", None)
    if code is None and isinstance(error, OSError) and str(error).startswith("Forbidden"):
        code = 403  # gcsfs raises a 403 as a plain OSError("Forbidden: ...")
    if isinstance(code, int):
        name = {403: "AccessDenied", 401: "AccessDenied", 429: "Throttling"}.get(code, str(code))
        return StoreError(name, code, f"gs://{bucket}/{key}: {error}")
    return error


class GCSClient:
    """The S3 client calls objectstore makes, for ``gs://`` buckets (``Bucket`` is the GCS bucket name)."""

    def __init__(self):
        self.fs = _filesystem()
        self.meta = _NoEvents()  # objectstore.count_failed_requests hooks botocore's events; gcsfs retries itself

    def _call(self, fn, bucket: str, key: str):
        try:
            return fn()
        except FileNotFoundError:
            raise
        except Exception as error:  # noqa: BLE001 - gcsfs's HttpError and aiohttp's errors
            translated = _translated(error, bucket, key)
            if translated is error:
                raise
            raise translated from error

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            self.fs.info(bucket)
            return True
        except FileNotFoundError:
            return False

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        info = self._call(lambda: self.fs.info(f"{Bucket}/{Key}"), Bucket, Key)
        if info.get("type") != "file":  # a "directory" (a prefix of other keys) is no object, as on S3
            raise FileNotFoundError(f"gs://{Bucket}/{Key}")
        return info

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        data = self._call(lambda: self.fs.cat_file(f"{Bucket}/{Key}"), Bucket, Key)
        return {"Body": _Body(data)}

    def list_objects_v2(self, Bucket: str, Prefix: str = "", MaxKeys: int | None = None) -> dict[str, Any]:
        if MaxKeys is not None:  # objectstore's probe: does the bucket answer (a missing one is NoSuchBucket)?
            if not self._call(lambda: self._bucket_exists(Bucket), Bucket, Prefix):
                raise StoreError("NoSuchBucket", 404, f"gs://{Bucket}: no such bucket")
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
            if not self._bucket_exists(bucket):
                raise StoreError("NoSuchBucket", 404, f"gs://{bucket}: no such bucket") from None
            return []
        keys = [path.split("/", 1)[1] for path in found]
        return sorted(k for k in keys if k.startswith(prefix))

    def download_file(self, Bucket: str, Key: str, Filename: str) -> None:
        self._call(lambda: self.fs.get_file(f"{Bucket}/{Key}", Filename), Bucket, Key)

    def upload_file(self, Filename: str, Bucket: str, Key: str) -> None:
        self._call(lambda: self.fs.put_file(Filename, f"{Bucket}/{Key}"), Bucket, Key)

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self._call(lambda: self.fs.pipe_file(f"{Bucket}/{Key}", Body), Bucket, Key)

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        # one request per key, keys taken literally (gcsfs's rm() expands [ ] * ? as patterns) and a key already
        # gone is no error, as in S3's DeleteObjects
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
    def __init__(self, client: GCSClient):
        self.client = client

    def paginate(self, Bucket: str, Prefix: str = ""):
        yield {"Contents": [{"Key": k} for k in self.client._list(Bucket, Prefix)]}


class _NoEvents:
    class events:  # noqa: N801 - botocore's attribute name
        @staticmethod
        def register_first(*args, **kwargs) -> None:
            return None
