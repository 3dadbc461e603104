"""A stand-in for the Hugging Face Hub on 127.0.0.1: a folder tree served as repos, read-only, answering only what
huggingface_hub's ``HfFileSystem`` and ``hf_hub_download`` ask (read from huggingface_hub's own source):

* ``GET /api/{models,datasets,spaces}/ORG/NAME[/revision/REV]``: repo info (``id``, ``sha``);
* ``GET /api/{kind}/ORG/NAME/tree/REV[/PATH]?recursive=...``: a folder's entries (one page; the repos are tiny);
* ``POST /api/{kind}/ORG/NAME/paths-info/REV`` (form ``paths``): the entries of the paths that exist;
* ``GET`` / ``HEAD /[datasets/|spaces/]ORG/NAME/resolve/REV/PATH``: a file, with ``Content-Length``, an ``ETag``
  (the git blob id), ``X-Repo-Commit`` and byte ranges.

A repo is the folder ``root/{models,datasets,spaces}/ORG/NAME``; its one revision is ``main``, also reachable by
its commit id (:meth:`FakeHub.commit`). Errors carry the ``X-Error-Code`` the Hub sends (RepoNotFound,
RevisionNotFound, EntryNotFound), which huggingface_hub turns into its error types. Anything else is 404, and
every request is recorded (``requests``) so that a test can check that nothing was written.

The ``hf_hub`` fixture starts one for a test and points huggingface_hub at it. huggingface_hub reads
``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` once, when it is imported (``huggingface_hub.constants``), and CI sets
``HF_HUB_OFFLINE=1`` for the whole run (tests/conftest.py): so the fixture sets both variables (processes the test
starts read them) and patches ``constants.HF_HUB_OFFLINE``, ``constants.ENDPOINT`` and the download URL template
made from it (``HUGGINGFACE_CO_URL_TEMPLATE``) in this process, all undone after the test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

KINDS = ("models", "datasets", "spaces")


@dataclass
class FakeHub:
    root: Path
    url: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)

    def repo(self, repo: str, kind: str = "models") -> Path:
        """The folder of repo ``ORG/NAME`` (made empty when new): files put there are served."""
        folder = self.root / kind / repo
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def upload(self, source: Path, repo: str, kind: str = "models", path_in_repo: str = "") -> None:
        """Copy the local folder ``source`` into the repo (as ``hf upload`` would commit it)."""
        shutil.copytree(source, self.repo(repo, kind) / path_in_repo, dirs_exist_ok=True)

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(f"commit of {repo}".encode()).hexdigest()


def _entry(path: Path, rel: str) -> dict:
    if path.is_dir():
        return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0, "path": rel}
    data = path.read_bytes()
    return {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), "size": len(data),
            "path": rel}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: no handler thread outlives the server waiting on one
    hub: FakeHub

    def log_message(self, *args) -> None:  # quiet
        return None

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, value) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str | None, head: bool = False) -> None:
        headers = {"Content-Type": "application/json", **({"X-Error-Code": code} if code else {})}
        self._send(status, b'{"error": "%s"}' % (code or "not found").encode(), headers, head)

    def _repo(self, kind: str, org: str, name: str, revision: str | None) -> Path | None:
        """The repo's folder, after answering an error (None) for a missing repo or revision."""
        folder = self.hub.root / kind / org / name
        if not folder.is_dir():
            self._error(404, "RepoNotFound")
            return None
        if revision not in (None, "main", FakeHub.commit(f"{org}/{name}")):
            self._error(404, "RevisionNotFound")
            return None
        return folder

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.hub.requests.append(("POST", self.path))
        body = self._body()
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if len(parts) == 6 and parts[0] == "api" and parts[1] in KINDS and parts[4] == "paths-info":
            folder = self._repo(parts[1], parts[2], parts[3], parts[5])
            if folder is None:
                return
            wanted = parse_qs(body.decode()).get("paths", [])
            self._json([_entry(folder / p, p) for p in wanted if p and (folder / p).exists()])
            return
        self._error(404, None)

    def do_HEAD(self) -> None:  # noqa: N802
        self._get(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._get(head=False)

    def _get(self, head: bool) -> None:
        self.hub.requests.append(("HEAD" if head else "GET", self.path))
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in KINDS:
            kind, org, name, rest = parts[1], parts[2], parts[3], parts[4:]
            if not rest or rest[0] == "revision":
                if self._repo(kind, org, name, "/".join(rest[1:]) or None) is not None:
                    repo = f"{org}/{name}"
                    self._json({"id": repo, "sha": FakeHub.commit(repo), "private": False, "siblings": []})
                return
            if rest[0] == "tree" and len(rest) >= 2:
                self._tree(kind, org, name, rest[1], "/".join(rest[2:]), parse_qs(url.query))
                return
        kind = parts[0] if parts[0] in ("datasets", "spaces") else "models"
        parts = parts[1:] if kind != "models" else parts
        if len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(kind, parts[0], parts[1], parts[3], "/".join(parts[4:]), head)
            return
        self._error(404, None, head)

    def _tree(self, kind: str, org: str, name: str, revision: str, path: str, query: dict) -> None:
        folder = self._repo(kind, org, name, revision)
        if folder is None:
            return
        start = folder / path
        if not start.is_dir():
            self._error(404, "EntryNotFound")
            return
        found = start.rglob("*") if query.get("recursive", ["false"])[0].lower() == "true" else start.iterdir()
        self._json(sorted((_entry(p, p.relative_to(folder).as_posix()) for p in found), key=lambda e: e["path"]))

    def _resolve(self, kind: str, org: str, name: str, revision: str, path: str, head: bool) -> None:
        folder = self._repo(kind, org, name, revision)
        if folder is None:
            return
        file = folder / path
        if not path or not file.is_file():
            self._error(404, "EntryNotFound", head)
            return
        data = file.read_bytes()
        headers = {"ETag": f'"{_entry(file, path)["oid"]}"', "X-Repo-Commit": FakeHub.commit(f"{org}/{name}"),
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        status, wanted = 200, self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted[len("bytes="):].partition("-")
            start, end = int(first or 0), min(int(last) + 1 if last else len(data), len(data))
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
                return
            status, headers["Content-Range"] = 206, f"bytes {start}-{end - 1}/{len(data)}"
            data = data[start:end]
        self._send(status, data, headers, head)


class HubServer:
    """A FakeHub served by a ThreadingHTTPServer on 127.0.0.1 (a free port), in a daemon thread."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.hub = FakeHub(root)
        handler = type("Handler", (_Handler,), {"hub": self.hub})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.hub.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hf-hub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture(name="hf_hub")  # a test module imports hub_fixture and asks for hf_hub
def hub_fixture(tmp_path, monkeypatch) -> FakeHub:
    """An empty fake Hub (``FakeHub``: make repos with ``.repo(...)`` / ``.upload(...)``) that huggingface_hub in
    this process, and the processes the test starts, talk to (see the module's doc for what is patched)."""
    from huggingface_hub import constants

    server = HubServer(tmp_path / "hub")
    url = server.hub.url
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")  # a developer's saved token is never sent
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    try:
        yield server.hub
    finally:
        server.stop()
