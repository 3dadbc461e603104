"""Object storage: the one module that talks to ``s3://`` stores (AWS S3, R2, MinIO, any S3-compatible endpoint)
and, for checkpoints, models and MDS data, ``gs://`` and Azure through core/fsspec_store.py (gcsfs, adlfs), ``oci://``
through OCI's S3 API (core/oci.py) and, read-only, the Hugging Face Hub (``hf://``, core/hf_store.py).

Everything that reads or writes a URL goes through here: checkpoints (train.checkpointer / train.uploads), data
preparation (data.prep), ICL task files (eval.icl.data) and model folders (loading). It gives

* URL handling: :func:`is_remote` (any ``scheme://`` URL, never a local folder), :func:`split_url`, :func:`join`;
  a URL of a store a key does not take (``dbfs:``; ``hf://`` where a key writes; ``gs://``, Azure and ``oci://``
  outside checkpoints, models and MDS data) is a one-line error;
* :func:`client`: a boto3 S3 client with connect/read timeouts; the endpoint from ``S3_ENDPOINT_URL`` (or
  ``AWS_ENDPOINT_URL_S3``), credentials from boto3's usual chain (oci://: core/oci.py's);
* :class:`Retry` (exponential backoff until a deadline) for callers that must survive an outage;
* :class:`ObjectFolder` (probe, exists, read, list, download or delete under a prefix) and whole-file helpers for
  local-or-remote paths;
* :func:`staging_root`: the local folder where files for a URL are staged;
* :func:`explain`: one error explainer that turns boto's errors into a one-line ConfigError naming the key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmfoundry.core import azure, hf_store, oci
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.core.gcs import GCSClient
from llmfoundry.core.gcs import emulator as gcs_emulator
from llmfoundry.core.scratch import user_temp_folder

T = TypeVar("T")
S3 = "s3://"
GS = "gs://"
AZURE = azure.SCHEMES  # azure://, az://, abfs://, abfss://, azure-dl://: one store, the container first
OCI = oci.SCHEME  # oci://bucket/path (or bucket@namespace): OCI's S3 compatibility API, core/oci.py
HF = hf_store.SCHEME  # hf://[datasets/]ORG/NAME[@REV]/path: the Hugging Face Hub, read-only (core/hf_store.py)
# Checkpoints (save_folder, load_path, autoresume), models (hf_checkpointer's exports, convert's input and OUT_DIR,
# eval/generate model paths) and MDS data (a loader's remote, the converters' output; streaming downloads and
# uploads through us, data/streaming_stores.py) take every store here; task files and the rest S3 only.
CHECKPOINT_STORES = (S3, GS, *AZURE, OCI)
DATA_STORES = (S3, GS, *AZURE, OCI)
FSSPEC_STORES = (GS, *AZURE)  # answered by core/fsspec_store.FsspecClient
ROUTED_STORES = (*FSSPEC_STORES, OCI, HF)  # stores whose data streaming downloads with our clients
SOURCES = (*CHECKPOINT_STORES, HF)  # keys that only read (hf_store.READ_BY) take hf:// too; keys that write refuse it
# The optional package each of those needs, and the extra that installs it.
NEEDS = {GS: ("gcsfs", "gcs"), **{scheme: ("adlfs", "azure") for scheme in AZURE}}
_MISSING = {"404", "nosuchkey", "notfound", "nosuchbucket", "nosuchentity"}


# ----------------------------------------------------------------------------------------------- URLs
def is_remote(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` names an object-store URL (``scheme://...`` or ``dbfs:``) rather than a local path."""
    if not isinstance(path, str):
        return False
    return "://" in path or path.startswith("dbfs:")


def check_url(url: str, key: str = "path", stores: tuple[str, ...] = (S3,)) -> None:
    """Raise a one-line ConfigError unless ``url`` is a ``scheme://bucket[/prefix]`` URL of one of ``stores``."""
    scheme = url.split("://", 1)[0] + "://" if "://" in url else url.split(":", 1)[0] + ":"
    if scheme == HF:
        hf_store.check(url, key, readable=HF in stores)
    if scheme in stores:
        if not url[len(scheme):].partition("/")[0]:
            raise ConfigError(f"{key}: '{url}' has no bucket (use {scheme}bucket/path)")
        if scheme in AZURE:
            azure.check_container(url, key)
        if scheme == OCI:
            oci.check(url, key)
        if scheme in NEEDS and importlib.util.find_spec(NEEDS[scheme][0]) is None:
            package, extra = NEEDS[scheme]
            raise ConfigError(f"{key}: '{url}': {scheme} needs {package} (pip install 'llmfoundry[{extra}]')")
        return
    names = {S3: "an s3:// URL", GS: "a gs:// URL", **{s: "an Azure URL (azure://container/path)" for s in AZURE},
             OCI: "an oci:// URL"}
    named = " or ".join(", ".join(dict.fromkeys(names.get(s, f"a {s} URL") for s in stores)).rsplit(", ", 1))
    more = f" ({scheme} works for {FSSPEC_KEYS} so far)" if scheme in (*FSSPEC_STORES, OCI) else ""
    raise ConfigError(f"{key}: '{url}': {scheme} object stores are not supported here{more}; use a local path or "
                      f"{named} (any S3-compatible store works through S3_ENDPOINT_URL)")


FSSPEC_KEYS = ("the top-level save_folder and load_path, a loader's remote, hf_checkpointer's save_folder, model "
               "paths (convert, eval, generate) and the converters' output")  # (said for gs://, Azure, oci://)


def split_url(url: str, key: str = "path", stores: tuple[str, ...] = (S3,)) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> (``bucket``, ``a/b``); ``oci://bucket@namespace/a/b`` -> (``bucket``, ``a/b``)."""
    check_url(url, key, stores)
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    return bucket.partition("@")[0] if url.startswith(OCI) else bucket, prefix.strip("/")  # (an OCI namespace)


def join(root: str, *parts: str) -> str:
    """``root`` and ``parts`` joined with ``/`` for a URL, with the OS separator for a local path."""
    if is_remote(root):
        return "/".join([root.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")])
    return os.path.join(root, *parts)


# ----------------------------------------------------------------------------------------------- client and errors
def client_for(url: str, max_attempts: int = 3, key: str = "path"):
    """The client for ``url``'s store: boto3's S3 client, or for ``gs://`` and Azure an fsspec_store.FsspecClient
    (the same calls). An Azure URL with no account set is a one-line ConfigError under ``key``."""
    if url.startswith(GS):
        return GCSClient()
    if url.startswith(AZURE):
        try:
            return azure.AzureClient()
        except azure.NoAccount as error:
            raise ConfigError(f"{key}: '{url}': {error}") from None
    if url.startswith(OCI):
        return client(max_attempts=max_attempts, oci_settings=oci.configured(url, key))
    if url.startswith(HF):
        return hf_store.client(url, key)
    return client(max_attempts=max_attempts)


def endpoint() -> str | None:
    return os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or None


# Bounds on every request: seconds to connect, seconds a read may wait for the next bytes (so no call hangs on a
# dead connection), and attempts per request; the environment sets them for every command and every rank.
TIMEOUT_ENV = {"connect_timeout_s": ("LLMFOUNDRY_S3_CONNECT_TIMEOUT", 5.0),
               "read_timeout_s": ("LLMFOUNDRY_S3_READ_TIMEOUT", 60.0)}


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name}: '{text}' is not a number of seconds above 0 (unset it for {default:g})")
    return value


def client(max_attempts: int = 3, connect_timeout_s: float | None = None, read_timeout_s: float | None = None,
           oci_settings: oci.Settings | None = None):
    """An S3 client for AWS or any S3-compatible store, its requests bounded by ``LLMFOUNDRY_S3_CONNECT_TIMEOUT``
    (5 s) and ``LLMFOUNDRY_S3_READ_TIMEOUT`` (60 s) unless given here. ``max_attempts`` is botocore's retries
    setting of that name: how often a failed request is asked again after its first attempt (1 = once more); the
    callers' :class:`Retry` loops go on beyond that. ``oci_settings``: OCI's S3 compatibility API (core/oci.py)."""
    import boto3  # imported on first use: checking a recipe or a URL does not need it
    from botocore.config import Config

    connect = connect_timeout_s if connect_timeout_s is not None else _seconds(*TIMEOUT_ENV["connect_timeout_s"])
    read = read_timeout_s if read_timeout_s is not None else _seconds(*TIMEOUT_ENV["read_timeout_s"])
    # OCI's S3 API: the bucket in the path, never in the host name
    options: dict[str, Any] = {"s3": {"addressing_style": "path"}} if oci_settings is not None else {}
    where = oci_settings.endpoint if oci_settings is not None else endpoint()
    if where and "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36
        # boto3 >= 1.36 adds CRC checksums to every upload by default; several S3-compatible stores (B2, Ceph,
        # OCI's S3 API, some MinIO versions) reject them. They are sent only where the operation requires them.
        options.update(request_checksum_calculation="when_required", response_checksum_validation="when_required")
    # a download runs DOWNLOAD_THREADS objects at once, each split by s3transfer into up to 10 ranged requests
    config = Config(retries={"max_attempts": max_attempts, "mode": "standard"}, connect_timeout=connect,
                    read_timeout=read, max_pool_connections=DOWNLOAD_THREADS * 10, **options)
    s3 = boto3.session.Session().client("s3", endpoint_url=where, config=config,
                                        **(oci_settings.credentials() if oci_settings is not None else {}))
    if oci_settings is not None:
        s3.meta.events.register("before-sign.s3", oci.md5_instead_of_crc)
    return s3


# How often botocore asks again for each request of an upload (every part of a multipart upload too) before the
# caller's Retry starts the file again: with one retry, a part failing twice restarted a multi-GB upload from its
# first byte (and a store failing every new part twice never took the file).
UPLOAD_REQUEST_RETRIES = 3


def count_failed_requests(s3, on_failure: Callable[[], None]) -> None:
    """Call ``on_failure`` for each request attempt of the client ``s3`` that failed (no answer, a 5xx or 429),
    whether botocore then asks again or gives up: what retried inside botocore stays visible to the caller."""
    def needs_retry(response=None, caught_exception=None, **_) -> None:
        status = response[0].status_code if response is not None else None
        if caught_exception is not None or (status is not None and (status >= 500 or status == 429)):
            on_failure()
        # None: no opinion; botocore's own handler decides whether to retry

    s3.meta.events.register_first("needs-retry.s3", needs_retry)


def error_code(error: BaseException) -> str:
    response = getattr(error, "response", None)  # botocore's timeouts carry response=None
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def is_missing(error: BaseException) -> bool:
    """Whether an error from the store means "no such object or bucket": botocore's error code (any case) or HTTP
    status 404. The message is not read: it quotes URLs and keys, and a port such as 40412 or a checkpoint named
    ep0-ba404 must not turn a dropped connection into a final "missing" that :class:`Retry` gives up on."""
    if isinstance(error, FileNotFoundError):
        return True
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    return error_code(error).lower() in _MISSING or response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404


# What a store answers when it is overloaded or failing for a moment (S3 and the S3-compatible stores): worth
# asking again. Connection failures are not in it: an unreachable endpoint is a set-up problem, said at once.
_TRANSIENT = {"slowdown", "serviceunavailable", "internalerror", "requesttimeout", "throttling",
              "throttlingexception", "requestlimitexceeded", "503", "500", "502", "504"}


def is_transient(error: BaseException) -> bool:
    """Whether the store answered with a server-side, passing failure (HTTP 5xx, SlowDown, throttling)."""
    code = getattr(error, "code", None)  # gcsfs's HttpError (it has asked again itself first)
    if isinstance(code, int) and (code >= 500 or code == 429):
        return True
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return error_code(error).lower() in _TRANSIENT or 500 <= int(status) < 600


def problem(error: BaseException) -> str:
    """A short description of a store failure: not found, no such bucket, access denied, or the error itself."""
    code = error_code(error)
    if code == "NoSuchBucket":
        return "no such bucket"
    if code in ("403", "AccessDenied"):
        return "access denied"
    if is_missing(error):
        return "not found"
    return f"{type(error).__name__}: {first_line(error)}"


def explain(error: BaseException, url: str, key: str) -> ConfigError:
    """A one-line ConfigError for an object-store error met while setting up (not while uploading)."""
    code = error_code(error)
    bucket = url.split("://", 1)[1].partition("/")[0] if "://" in url else url
    if url.startswith(HF):  # a repository, not a bucket
        return hf_store.explain(url, key, code, is_missing(error), first_line(error))
    if url.startswith(OCI):
        bucket, where, setting, credentials = oci.described(url)
    elif url.startswith(GS):
        where = gcs_emulator() or "Google Cloud Storage"
        setting = "STORAGE_EMULATOR_HOST" if gcs_emulator() else "the bucket name"
        credentials = "GOOGLE_APPLICATION_CREDENTIALS (or gcloud auth application-default login)"
    elif url.startswith(AZURE):
        where, setting, credentials = azure.endpoint(), azure.setting(), azure.CREDENTIALS
    else:
        where, setting = endpoint() or "AWS S3", "S3_ENDPOINT_URL"
        credentials = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    if code == "NoSuchBucket":
        return ConfigError(f"{key}: bucket '{bucket}' does not exist at {where} (create it, or check the name "
                           f"and {setting})")
    if is_missing(error):  # the bucket answers, the object is not there
        return ConfigError(f"{key}: '{url}' was not found at {where} (check the path)")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return ConfigError(f"{key}: access to '{url}' was refused ({code}); check {credentials} and the bucket's "
                           "permissions")
    return ConfigError(f"{key}: cannot reach '{url}' at {where} ({first_line(error)}); check {setting} and the "
                       "network")


@dataclass
class Retry:
    """Exponential backoff until a deadline: ``Retry(...).call(fn)`` returns fn()'s result or raises the last error.
    A "missing" answer is final and raised at once."""

    deadline: float  # time.monotonic() value
    initial_s: float = 0.5
    max_s: float = 8.0
    on_retry: Callable[[Exception, float], None] | None = None
    only_if: Callable[[BaseException], bool] | None = None  # retry only errors it accepts (default: any)

    def call(self, fn: Callable[[], T]) -> T:
        wait = self.initial_s
        while True:
            try:
                return fn()
            except Exception as error:  # noqa: BLE001 - network errors come in many types
                if (is_missing(error) or time.monotonic() + wait > self.deadline
                        or (self.only_if is not None and not self.only_if(error))):
                    raise
                if self.on_retry is not None:
                    self.on_retry(error, wait)
                time.sleep(wait)
                wait = min(self.max_s, wait * 2)


# ----------------------------------------------------------------------------------------------- folders
READ_DEADLINE_ENV = ("LLMFOUNDRY_S3_READ_DEADLINE", 120.0)
DOWNLOAD_THREADS = 8  # objects of one download fetched at once (each large one is also split by s3transfer)
DELETE_BATCH = 1000  # keys per DeleteObjects request: S3's limit
# how S3-compatible stores refuse DeleteObjects (not implemented, or its required checksum header not accepted)
BATCH_DELETE_REFUSED = {"NotImplemented", "MissingContentMD5", "InvalidRequest", "BadDigest", "InvalidDigest",
                        "XAmzContentChecksumMismatch", "MethodNotAllowed"}


class ObjectFolder:
    """The objects under one ``s3://bucket/prefix`` (or ``gs://`` or Azure where ``stores`` allows it): exists,
    read, list, download, delete.

    Every read (exists, read, list, each object of a download) is asked again, with backoff, while the store answers
    with a passing server-side failure (503 SlowDown, 500, throttling), until ``LLMFOUNDRY_S3_READ_DEADLINE``
    seconds (120) after the read began: a resume goes through a storm of 503s instead of ending at the first."""

    def __init__(self, url: str, key: str = "path", *, max_attempts: int = 1, stores: tuple[str, ...] = (S3,)):
        self.url = url.rstrip("/")
        self.bucket, self.prefix = split_url(url, key, stores)
        self.client = client_for(self.url, max_attempts, key)  # boto3's S3 client, or an fsspec_store.FsspecClient
        self.retries = 0  # reads asked again so far
        self._counting = threading.Lock()  # downloads read from several threads

    def _read(self, fn: Callable[[], T]) -> T:
        def counted(error: Exception, wait: float) -> None:
            with self._counting:
                self.retries += 1

        deadline = time.monotonic() + _seconds(*READ_DEADLINE_ENV)
        return Retry(deadline, initial_s=0.1, max_s=4.0, on_retry=counted, only_if=is_transient).call(fn)

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def exists(self, *parts: str) -> bool:
        try:
            self._read(lambda: self.client.head_object(Bucket=self.bucket, Key=self.key(*parts)))
            return True
        except Exception as error:  # noqa: BLE001
            if is_missing(error):
                return False
            raise

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            return self._read(lambda: self.client.get_object(Bucket=self.bucket, Key=self.key(*parts))["Body"].read())
        except Exception as error:  # noqa: BLE001
            if is_missing(error):
                return None
            raise

    def read_text(self, *parts: str) -> str | None:
        data = self.read_bytes(*parts)
        return None if data is None else data.decode()

    def probe(self) -> None:
        """One cheap request (a one-key listing under the prefix) that fails as writing would: no such bucket, no
        access, no endpoint. For checks up front, before slow work whose result would have nowhere to go."""
        prefix = self.key()
        self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix + "/" if prefix else "", MaxKeys=1)

    def list_keys(self, *parts: str) -> list[str]:
        """Full keys of every object under ``prefix/parts/``."""
        prefix = self.key(*parts)
        prefix = prefix + "/" if prefix else ""
        def listing() -> list[str]:
            keys = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys += [item["Key"] for item in page.get("Contents", [])]
            return keys

        return self._read(listing)

    def download(self, name: str, dest: Path, skip: Callable[[str], bool] = lambda rel: False) -> Path:
        """Copy the objects under ``name`` into a fresh ``dest/name`` (each file written atomically), several at a
        time (``DOWNLOAD_THREADS``: a checkpoint is one file per rank, and a resume waits for all of them); ``skip``
        leaves out relative paths. Returns that folder."""
        target = Path(dest) / inside(name, self.url)
        shutil.rmtree(target, ignore_errors=True)
        base = self.key(name)
        wanted = [(key, key[len(base) + 1:] if base else key) for key in self.list_keys(name)]
        # a console's "folder" placeholder (a key ending in /) holds nothing; every other key is checked first
        wanted = [(key, inside(rel, f"{self.url}/{name}")) for key, rel in wanted if not key.endswith("/")]

        def fetch(key: str, rel: str) -> None:
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            self._read(lambda: self.client.download_file(self.bucket, key, str(tmp)))
            os.replace(tmp, path)

        # the pool ends with the call: no thread outlives a download; the first failure (or Ctrl-C) cancels the
        # objects not started yet instead of waiting for all of them
        pool = ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS, thread_name_prefix="s3-download")
        try:
            for done in [pool.submit(fetch, key, rel) for key, rel in wanted if not skip(rel)]:
                done.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return target

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` in order, ``DELETE_BATCH`` per request (DeleteObjects): one request per key would take
        minutes for a large checkpoint. A key the store could not delete is an error naming it."""
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start:start + DELETE_BATCH]]
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as error:  # noqa: BLE001 - botocore's ClientError
                if error_code(error) not in BATCH_DELETE_REFUSED:
                    raise
                # an S3-compatible store without DeleteObjects, or refusing its checksum: one request per key
                for item in batch:
                    self.client.delete_object(Bucket=self.bucket, Key=item["Key"])
                continue
            failed = answer.get("Errors") or []
            if failed:
                first = failed[0]
                raise OSError(f"{self.url.split('://')[0]}://{self.bucket}/{first.get('Key')}: not deleted ({first.get('Code')}: "
                              f"{first.get('Message')}; {len(failed)} key(s) in all)")


def inside(rel: str, where: str) -> str:
    """``rel`` (a key below a listed prefix, or a name read from a pointer object) when joining it to a local
    folder stays inside that folder; a key with ``..``, ``.`` or empty parts, an absolute path, a backslash or a
    NUL is a one-line ConfigError: a bucket someone else writes must not place files anywhere else on disk."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{where}: object key '{rel}' would be written outside the local staging folder ('..', "
                          "an absolute path or an empty part in it); refused, nothing was downloaded from it")
    return rel


# ----------------------------------------------------------------------------------------------- whole files
def read_bytes(path: str, stores: tuple[str, ...] = (S3,)) -> bytes | None:
    """A file's bytes, local or in an object store; None when it does not exist."""
    if is_remote(path):
        bucket, key = split_url(path, stores=stores)
        try:
            return client_for(path).get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as error:  # noqa: BLE001 - botocore ClientError: 404 / NoSuchKey on different stores
            if is_missing(error):
                return None
            raise
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path: str, data: bytes, stores: tuple[str, ...] = (S3,)) -> None:
    """Write a file, local (atomically, by rename) or in an object store."""
    if is_remote(path):
        bucket, key = split_url(path, stores=stores)
        client_for(path).put_object(Bucket=bucket, Key=key, Body=data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def download_file(url: str, dest: str | Path, stores: tuple[str, ...] = (S3,)) -> None:
    """Copy one object to the local file ``dest`` (atomically)."""
    bucket, key = split_url(url, stores=stores)
    tmp = f"{dest}.tmp{os.getpid()}"
    client_for(url).download_file(bucket, key, tmp)
    os.replace(tmp, dest)


def list_files(root: str, suffixes: tuple[str, ...], stores: tuple[str, ...] = (S3,)) -> list[str]:
    """Files under ``root`` (recursively, sorted) whose names end with one of ``suffixes``; local or remote."""
    if is_remote(root):
        folder = ObjectFolder(root, max_attempts=3, stores=stores)
        return sorted(f"{'/'.join(root.split('/', 3)[:3])}/{k}" for k in folder.list_keys() if k.endswith(suffixes))
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.join(folder, n) for n in names if n.endswith(suffixes)]
    return sorted(found)


def remove_tree(root: str, stores: tuple[str, ...] = (S3,)) -> None:
    """Delete a local folder or every object under a URL's prefix."""
    if not is_remote(root):
        shutil.rmtree(root, ignore_errors=True)
        return
    folder = ObjectFolder(root, max_attempts=3, stores=stores)
    folder.delete(folder.list_keys())


# ----------------------------------------------------------------------------------------------- staging
def staging_root(url: str, configured: str | None = None) -> Path:
    """The local folder where files for ``url`` are staged (uploads) or cached (downloads): ``configured`` when
    given, else a folder under this user's temp folder named by a hash of the URL. ``LLMFOUNDRY_STAGING_DIR``
    moves the default root (tests give each test its own)."""
    if configured:
        return Path(configured)
    root = os.environ.get("LLMFOUNDRY_STAGING_DIR") or user_temp_folder("llmfoundry-staging", "LLMFOUNDRY_STAGING_DIR")
    return Path(root) / hashlib.sha1(url.encode()).hexdigest()[:12]
