"""Shared fixtures: a tiny locally trained tokenizer, a tiny text corpus and MDS shards made from it (nothing is
downloaded), a moto S3 server, and a staging folder of its own for every test.

Plain helper functions and constants are in tests/helpers.py (``from tests.helpers import ...``).
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import (
    AZURE_TEST_CONTAINER,
    GCS_TEST_BUCKET,
    OCI_TEST_BUCKET,
    S3_TEST_BUCKET,
    TINY_RECIPE_SEQ,
    convert_text_folder,
    make_corpus,
    write_text_folder,
)

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def own_staging_dir(tmp_path, monkeypatch):
    """LLMFOUNDRY_STAGING_DIR points into this test's tmp_path, so that no two tests (nor two suites running at
    once) share the default staging folder; subprocesses started by the test inherit it."""
    folder = tmp_path / "llmfoundry-staging"
    monkeypatch.setenv("LLMFOUNDRY_STAGING_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, corpus):
    """A folder holding a 512-token byte-level BPE tokenizer trained on ``corpus`` (AutoTokenizer loads it)."""
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_bpe_tokenizer(corpus, vocab_size=512, out_dir=out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def mds_root(tmp_path_factory, corpus, tokenizer_dir):
    """MDS shards of 64-token samples (``TINY_RECIPE_SEQ``) from the corpus: 160 documents in root/train, 40 in
    root/val (the splits ``tiny_recipe`` and the shipped pretraining recipes read)."""
    root = tmp_path_factory.mktemp("mds")
    for split, docs in {"train": corpus[:160], "val": corpus[160:]}.items():
        source = write_text_folder(root / "text" / split, docs)
        convert_text_folder(source, root / split, tokenizer_dir, TINY_RECIPE_SEQ)
    return root


# ----------------------------------------------------------------------------------------------- S3 (moto server)
class MotoS3Server:
    """moto's S3 server in a thread on 127.0.0.1 (a free port); ``stop()``/``start()`` simulate an outage.

    The stored objects live in this process's moto backend, so they survive a stop/start on the same port.
    """

    def __init__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        if self._server is None:
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def reset(self) -> None:
        """Delete every bucket and object."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10).read()


@pytest.fixture(scope="session")
def moto_s3():
    """The session's moto S3 server (use ``s3_server`` in tests; this one to stop/start it)."""
    server = MotoS3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_server(moto_s3, monkeypatch):
    """Endpoint URL of a running, empty moto S3 server holding the bucket ``tests.helpers.S3_TEST_BUCKET``.

    Sets AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION / S3_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for the test (subprocesses
    started by the test inherit them). ``moto_s3.stop()`` / ``moto_s3.start()`` simulate an outage.
    """
    moto_s3.start()  # a test may have stopped it
    moto_s3.reset()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "S3_ENDPOINT_URL": moto_s3.url,  # streaming and llmfoundry read this one
        "AWS_ENDPOINT_URL_S3": moto_s3.url,  # plain boto3 clients read this one
    }.items():
        monkeypatch.setenv(name, value)
    import boto3

    boto3.client("s3", endpoint_url=moto_s3.url).create_bucket(Bucket=S3_TEST_BUCKET)
    yield moto_s3.url


# ----------------------------------------------------------------------------------------------- OCI (S3 API on moto)
OCI_TEST_KEY = ("oci-test-key-id", "oci-test-secret-key")  # the customer secret key the stand-in accepts
OCI_TEST_REGION = "us-ashburn-1"  # the region the stand-in wants requests signed for


def oci_refusals(method: str, path: str, headers) -> tuple[int, str, str] | None:
    """What the OCI stand-in refuses that moto takes: the CRC checksum headers boto3 >= 1.36 adds by default (OCI's
    S3 API rejects them; the code and message here are modelled, not recorded from OCI), and a request signed with
    another key or for another region than OCI's (its S3 API checks both; moto checks neither)."""
    names = {name.lower(): value for name, value in headers.items()}
    if any(name.startswith(("x-amz-checksum-", "x-amz-sdk-checksum-algorithm")) for name in names) or \
            "TRAILER" in names.get("x-amz-content-sha256", "").upper():
        return 400, "InvalidArgument", "checksum headers are not supported"
    credential = names.get("authorization", "").partition("Credential=")[2].split(",")[0].split("/")
    if len(credential) < 3 or credential[0] != OCI_TEST_KEY[0]:
        return 403, "InvalidAccessKeyId", "the access key id is not a customer secret key of this tenancy"
    if credential[2] != OCI_TEST_REGION:
        return 400, "AuthorizationHeaderMalformed", f"the region '{credential[2]}' is wrong; expecting " \
                                                    f"{OCI_TEST_REGION}"
    return None


@pytest.fixture
def oci_server(moto_s3, monkeypatch, tmp_path):
    """The OCI stand-in: moto's S3 server behind a proxy that refuses what OCI's S3 compatibility API refuses
    (``oci_refusals``), empty but for the bucket ``OCI_TEST_BUCKET``. Sets OCI_S3_ENDPOINT_URL (the proxy),
    OCI_REGION and the OCI_S3_* customer secret key for the test and the processes it starts, points
    OCI_CONFIG_FILE at no file and clears the AWS_* and S3 endpoint variables (nothing of S3's set-up is used).
    Yields the proxy (``.url``, ``.refused``)."""
    import boto3

    from tests.http_fault_proxy import FaultProxy

    moto_s3.start()
    moto_s3.reset()
    boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1", aws_access_key_id="moto",
                 aws_secret_access_key="moto").create_bucket(Bucket=OCI_TEST_BUCKET)
    proxy = FaultProxy("127.0.0.1", moto_s3.port, failures=0, refuse=oci_refusals)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "S3_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "OCI_NAMESPACE", "OCI_CLI_PROFILE", "OCI_CLI_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"OCI_S3_ENDPOINT_URL": proxy.url, "OCI_REGION": OCI_TEST_REGION,
                        "OCI_S3_ACCESS_KEY_ID": OCI_TEST_KEY[0], "OCI_S3_SECRET_ACCESS_KEY": OCI_TEST_KEY[1],
                        "OCI_CONFIG_FILE": str(tmp_path / "no-oci-config"),
                        "AWS_DEFAULT_REGION": "eu-west-1"}.items():  # a wrong region: the OCI one must win
        monkeypatch.setenv(name, value)
    yield proxy
    proxy.close()


# ----------------------------------------------------------------------------------------------- GCS (emulator)
class GCSEmulator:
    """gcp-storage-emulator (PyPI) in a thread on 127.0.0.1 (a free port), objects in memory."""

    def __init__(self):
        import socket

        from gcp_storage_emulator.server import create_server

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._server = create_server("127.0.0.1", port, in_memory=True)
        self._server.start()

    def reset(self, bucket: str) -> None:
        """Delete every bucket and object, then make ``bucket`` (through the JSON API, as any client would)."""
        import json
        import urllib.request

        self._server.wipe()
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": bucket}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture(scope="session")
def gcs_emulator():
    server = GCSEmulator()
    yield server
    server.stop()


@pytest.fixture
def gcs_server(gcs_emulator, monkeypatch):
    """URL of a running, empty GCS emulator holding the bucket ``tests.helpers.GCS_TEST_BUCKET``; sets
    STORAGE_EMULATOR_HOST for the test (and the processes it starts)."""
    gcs_emulator.reset(GCS_TEST_BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    yield gcs_emulator.url


# ----------------------------------------------------------------------------------------------- Azure (Azurite)
class Azurite:
    """Azurite's blob service (npm; installed by tests/setup_azurite.sh) in a process on 127.0.0.1 (a free port),
    objects in memory. ``connection_string`` holds Azurite's well-known development account and key."""

    KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

    def __init__(self, binary: str, location):
        import socket
        import subprocess
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/devstoreaccount1"
        self.connection_string = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={self.KEY};"
                                  f"BlobEndpoint={self.url};")
        self._process = subprocess.Popen(
            [binary, "--inMemoryPersistence", "--skipApiVersionCheck", "--blobHost", "127.0.0.1", "--blobPort",
             str(port), "--silent"],
            cwd=location, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # anything it writes stays there
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"azurite did not start: {self._process.stderr.read().decode()[-2000:]}")
                time.sleep(0.1)

    def reset(self, container: str) -> None:
        """Delete every container, then make ``container``."""
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as service:
            for found in service.list_containers():
                service.delete_container(found.name)
            service.create_container(container)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self._process.kill()
                self._process.wait()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """The session's Azurite (use ``azure_server`` in tests). Skipped, saying so, where node/npm are missing."""
    import subprocess
    from pathlib import Path

    setup = Path(__file__).with_name("setup_azurite.sh")
    result = subprocess.run(["bash", str(setup)], check=False, capture_output=True, text=True, timeout=600)
    if result.returncode == 3:
        pytest.skip(f"Azurite cannot be installed here: {result.stderr.strip()}")
    assert result.returncode == 0, f"setup_azurite.sh failed:\n{result.stdout}\n{result.stderr}"
    server = Azurite(result.stdout.strip().splitlines()[-1], tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture
def azure_server(azurite, monkeypatch):
    """Azurite, empty but for the container ``tests.helpers.AZURE_TEST_CONTAINER``; sets
    AZURE_STORAGE_CONNECTION_STRING for the test (and the processes it starts) and clears the other
    AZURE_STORAGE_* variables. Yields the blob endpoint's URL."""
    azurite.reset(AZURE_TEST_CONTAINER)
    for name in ("ACCOUNT_NAME", "ACCOUNT_KEY", "SAS_TOKEN", "CLIENT_ID", "CLIENT_SECRET", "TENANT_ID", "ANON"):
        monkeypatch.delenv(f"AZURE_STORAGE_{name}", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    yield azurite.url


@pytest.fixture(params=["gs", "azure"])
def fsspec_store(request) -> str:
    """The root URL of an empty bucket on each store answered through core/fsspec_store.py, in turn:
    ``gs://`` + GCS_TEST_BUCKET on the GCS emulator, ``azure://`` + AZURE_TEST_CONTAINER on Azurite."""
    if request.param == "gs":
        request.getfixturevalue("gcs_server")
        return f"gs://{GCS_TEST_BUCKET}"
    request.getfixturevalue("azure_server")
    return f"azure://{AZURE_TEST_CONTAINER}"


def _threads_alive() -> str:
    """``N (kind xcount, ...)``: the threads alive in this process."""
    import threading

    names: dict[str, int] = {}
    for thread in threading.enumerate():
        kind = thread.name.rstrip("0123456789_-")
        names[kind] = names.get(kind, 0) + 1
    shown = ", ".join(f"{name} x{count}" for name, count in sorted(names.items(), key=lambda item: -item[1])[:6])
    return f"{threading.active_count()} ({shown})"


def pytest_sessionfinish(session):
    """An xdist worker hands its count to the controller, which prints them all (pytest_testnodedown)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["threads_alive"] = _threads_alive()


_WORKER_THREADS: dict[str, str] = {}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: known only when xdist runs
def pytest_testnodedown(node, error):
    _WORKER_THREADS[node.gateway.id] = getattr(node, "workeroutput", {}).get("threads_alive", "unknown")


def pytest_terminal_summary(terminalreporter):
    """Threads still alive in each process that ran tests: background threads that outlive their test
    (streaming's epoch threads before data/text.py's EndsAbandonedEpochs) slow down every test after them."""
    if _WORKER_THREADS:
        for worker, threads in sorted(_WORKER_THREADS.items()):
            terminalreporter.write_line(f"threads alive at the end of {worker}: {threads}")
    else:
        terminalreporter.write_line(f"threads alive at the end: {_threads_alive()}")


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``-n``), the tests that start a Ray cluster or use the Slurm daemons run on one worker,
    one after another: two Ray head nodes, or two set-ups of the same daemons, must not overlap."""
    for item in items:
        if item.get_closest_marker("ray") or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
