"""Shared fixtures: a tiny locally trained tokenizer and a tiny text corpus (nothing is downloaded)."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_WORDS = (
    "the a model learns to predict next token from data which flows through layers of attention and "
    "feed forward networks while an optimizer updates weights after each batch of text samples in order "
    "cat dog runs jumps quickly slowly over under river mountain city small large blue green red"
).split()


def make_corpus(num_docs: int = 200, seed: int = 0) -> list[str]:
    """Deterministic English-like documents of a few sentences each."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
            sentences.append(" ".join(words).capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


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


S3_TEST_BUCKET = "llmfoundry-test"


@pytest.fixture
def s3_server(moto_s3, monkeypatch):
    """Endpoint URL of a running, empty moto S3 server holding the bucket ``S3_TEST_BUCKET`` ('llmfoundry-test').

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
