"""``hf://`` (the Hugging Face Hub), read-only: data, checkpoints and models are read from Hub repos through
huggingface_hub's ``HfFileSystem``, answering the read calls of the S3 client that core/objectstore.py makes (the
adapter of core/fsspec_store.py). Nothing is ever written to the Hub here: every key that writes refuses ``hf://``
(objectstore.check_url), and this client refuses writes too.

URLs are spelled as HfFileSystem, streaming and llm-foundry spell them: ``hf://datasets/ORG/NAME/path`` (a dataset
repo), ``hf://ORG/NAME/path`` (a model repo; ``hf://models/ORG/NAME/path`` means the same), ``hf://spaces/...``; a
revision follows the name: ``hf://ORG/NAME@v1.0/path``, ``@<commit>``, ``@refs/pr/3``. The URL's first component is
objectstore's "bucket" (``datasets`` or ``ORG``), so its URL slicing works unchanged; this client finds the repo in
``bucket/key`` itself.

The Hub is ``HF_ENDPOINT`` (read at each client, default https://huggingface.co), the token huggingface_hub's own
(``HF_TOKEN``, or ``hf auth login``). ``HF_HUB_OFFLINE=1`` is a one-line error: it forbids every request.
"""

from __future__ import annotations

import os
from typing import Any

import huggingface_hub  # its HfFileSystem is loaded on first use (huggingface_hub's lazy attributes): 0.8 s
from huggingface_hub import constants

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.fsspec_store import FsspecClient, Store, StoreError, _Body

SCHEME = "hf://"
KINDS = ("datasets", "spaces", "models")  # hf://KIND/ORG/NAME/...; without one, a model repo
UPLOAD = "hf upload ORG/NAME FOLDER"  # huggingface_hub's command line: how a folder gets onto the Hub
EXAMPLES = "hf://datasets/ORG/NAME/path for a dataset, hf://ORG/NAME/path for a model"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def repo_root(path: str) -> tuple[str, str]:
    """``datasets/org/name@rev/a/b`` -> (``datasets/org/name@rev``, ``a/b``); ``org/name/a`` -> (``org/name``,
    ``a``). A revision ``refs/pr/N`` (``refs/convert/X``) takes two more components."""
    parts = path.split("/")
    n = 3 if parts[0] in KINDS else 2
    if len(parts) >= n + 2 and parts[n - 1].endswith("@refs"):
        n += 2
    return "/".join(parts[:n]), "/".join(parts[n:])


# the keys that take hf:// (objectstore.SOURCES): they only read
READ_BY = "load_path, a loader's remote and model paths (convert's input, eval, generate)"


def _names_repo(root: str) -> bool:
    parts = root.split("/")
    names = parts[1:] if parts[0] in KINDS else parts
    return len(names) >= 2 and bool(names[0]) and bool(names[1].partition("@")[0])


def check(url: str, key: str, readable: bool) -> None:
    """A one-line ConfigError unless ``key`` reads (``readable``: a key that writes says that hf:// is read-only and
    how to put files on the Hub) and ``url`` names an owner (a folder above a repo, ``hf://ORG``, is where a
    model at a repo's root is downloaded from; a missing repo is said when it is read) and no storage bucket."""
    if not readable:
        raise ConfigError(f"{key}: '{url}': hf:// is read-only here (it is read by {READ_BY}); write to a local "
                          f"folder or another store, then upload it with `{UPLOAD}`")
    parts = url[len(SCHEME):].split("/")
    if parts[0] == "buckets":
        raise ConfigError(f"{key}: '{url}': Hub storage buckets are not supported, only repos ({EXAMPLES})")
    owner = parts[1:2] if parts[0] in KINDS else parts[:1]
    if not owner or not owner[0]:
        raise ConfigError(f"{key}: '{url}' names no repository (write {EXAMPLES})")


def _fs_path(path: str) -> str:
    """HfFileSystem's path for ``bucket/key``: a model repo without the optional ``models/``."""
    return path.removeprefix("models/")


def _status(error: BaseException) -> tuple[int, str | None] | None:
    status = getattr(getattr(error, "response", None), "status_code", None)  # huggingface_hub's HfHubHTTPError
    if not isinstance(status, int):
        return None  # no answer (a connection failure, offline mode)
    return status, ("AccessDenied" if status in (401, 403) else None)  # 401: a gated repo without a token


class Offline(Exception):
    """HF_HUB_OFFLINE is set: huggingface_hub refuses every request."""


def _filesystem():
    if constants.HF_HUB_OFFLINE:
        raise Offline("HF_HUB_OFFLINE is set, so the Hub cannot be read (unset it, or download the files and give "
                      "a local path)")
    # an instance of our own: fsspec's cache would keep the listings of another test's or run's Hub
    return huggingface_hub.HfFileSystem(endpoint=endpoint(), skip_instance_cache=True)


HF = Store("hf", _filesystem, _status)


def client(url: str, key: str) -> HfClient:
    try:
        return HfClient()
    except Offline as error:
        raise ConfigError(f"{key}: '{url}': {error}") from None


def explain(url: str, key: str, code: str, missing: bool, said: str) -> ConfigError:
    """objectstore.explain's one line for hf:// (``code``: the error's S3 code, ``missing``: it means "not
    found", ``said``: its first line)."""
    repo = SCHEME + repo_root(url[len(SCHEME):])[0].rstrip("/")
    if code == "NoSuchBucket":
        return ConfigError(f"{key}: repository '{repo}' was not found at {endpoint()} (check its name and revision; "
                           "a private or gated repo needs HF_TOKEN)")
    if missing:
        return ConfigError(f"{key}: '{url}' was not found at {endpoint()} (check the path)")
    if code == "AccessDenied":
        return ConfigError(f"{key}: access to '{repo}' was refused; check HF_TOKEN (or hf auth login) and that the "
                           "account may read the repo (a gated repo's terms accepted)")
    return ConfigError(f"{key}: cannot reach '{url}' at {endpoint()} ({said}); check HF_ENDPOINT and the network")


class HfClient(FsspecClient):
    """The read calls of the S3 client for ``hf://`` (``Bucket`` is the URL's first component, ``datasets`` or the
    org); the write calls raise: the Hub is a source only."""

    def __init__(self):
        super().__init__(HF)

    def _info(self, bucket: str, key: str) -> dict[str, Any]:
        return self._call(lambda: self.fs.info(_fs_path(f"{bucket}/{key}")), bucket, key)

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        info = self._info(Bucket, Key)
        if info.get("type") != "file":  # a folder is no object, as on S3
            raise FileNotFoundError(f"{SCHEME}{Bucket}/{Key}")
        return info

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return self._call(lambda: {"Body": _Body(self.fs.cat_file(_fs_path(f"{Bucket}/{Key}")))}, Bucket, Key)

    def download_file(self, Bucket: str, Key: str, Filename: str) -> None:
        self._call(lambda: self.fs.get_file(_fs_path(f"{Bucket}/{Key}"), Filename), Bucket, Key)

    def _repo_exists(self, bucket: str, key: str) -> bool:
        root, _ = repo_root(f"{bucket}/{key}")
        if not _names_repo(root):  # hf://ORG alone
            return False
        try:
            self._call(lambda: self.fs.resolve_path(_fs_path(root)), bucket, key)
        except FileNotFoundError:  # no such repo or revision (or a private one without a token)
            return False
        return True

    def _no_repo(self, bucket: str, key: str) -> StoreError:
        root, _ = repo_root(f"{bucket}/{key}")
        return StoreError("NoSuchBucket", 404, f"{SCHEME}{root.rstrip('/')}: no such repository or revision")

    def list_objects_v2(self, Bucket: str, Prefix: str = "", MaxKeys: int | None = None) -> dict[str, Any]:
        if MaxKeys is not None:  # objectstore's probe: does the repo answer?
            if not self._repo_exists(Bucket, Prefix):
                raise self._no_repo(Bucket, Prefix)
            return {"Contents": []}
        return {"Contents": [{"Key": k} for k in self._list(Bucket, Prefix)]}

    def _list(self, bucket: str, prefix: str) -> list[str]:
        """Every key (below ``bucket``) starting with ``prefix``, S3's prefix rule, listed from the folder that
        holds the prefix's last part."""
        root, inside = repo_root(f"{bucket}/{prefix}")
        if not _names_repo(root):  # the repos of an owner are not listed
            raise self._no_repo(bucket, prefix)
        folder = inside.rpartition("/")[0]
        try:
            found = self._call(lambda: self.fs.find(_fs_path(f"{root}/{folder}" if folder else root)), bucket, prefix)
        except FileNotFoundError:  # no such folder (or repo: asked below)
            found = []
        # each name is HfFileSystem's spelling of the repo (its quoting of a revision) and the path in it
        in_repo = [self.fs.resolve_path(name).path_in_repo for name in found]
        head = root[len(bucket) + 1:]  # the repo's part of the key, as the URL spells it
        keys = sorted(k for k in (f"{head}/{path}" if head else path for path in in_repo) if k.startswith(prefix))
        if not keys and not self._repo_exists(bucket, prefix):
            raise self._no_repo(bucket, prefix)
        return keys

    def _refuse(self, bucket: str, key: str) -> StoreError:
        return StoreError("AccessDenied", 403, f"{SCHEME}{bucket}/{key}: hf:// is read-only here (upload a "
                                               f"local folder with `{UPLOAD}`)")

    def upload_file(self, Filename: str, Bucket: str, Key: str) -> None:
        raise self._refuse(Bucket, Key)

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        raise self._refuse(Bucket, Key)

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        raise self._refuse(Bucket, Delete["Objects"][0]["Key"] if Delete["Objects"] else "")

    def delete_object(self, Bucket: str, Key: str) -> None:
        raise self._refuse(Bucket, Key)

