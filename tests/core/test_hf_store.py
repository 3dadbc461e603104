"""core/hf_store.HfClient: the Hugging Face Hub (a fake one on 127.0.0.1, tests/hf_hub_server.py) read through the
calls objectstore makes, with S3's meanings; URLs as HfFileSystem, streaming and llm-foundry spell them; every
write refused in one line, and nothing ever sent to the Hub but reads."""

from __future__ import annotations

import pytest

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.train.checkpointer import stage_model_path
from tests.hf_hub_server import FakeHub, hub_fixture  # noqa: F401 (the hf_hub fixture)


@pytest.fixture
def repos(hf_hub):
    data = hf_hub.repo("org/tiny", "datasets")
    (data / "train" / "sub").mkdir(parents=True)
    (data / "train" / "index.json").write_text('{"shards": []}')
    (data / "train" / "sub" / "shard.00000.mds").write_bytes(bytes(range(256)) * 40)
    (data / "trainer.txt").write_text("not in train/")
    model = hf_hub.repo("org/model")
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    return hf_hub


def test_listing_reading_and_downloading_mean_what_they_mean_on_s3(repos, tmp_path):
    folder = objectstore.ObjectFolder("hf://datasets/org/tiny/train", stores=objectstore.SOURCES)
    assert (folder.bucket, folder.prefix) == ("datasets", "org/tiny/train")
    assert folder.list_keys() == ["org/tiny/train/index.json", "org/tiny/train/sub/shard.00000.mds"]
    assert folder.exists("index.json") and not folder.exists("sub") and not folder.exists("missing")
    assert folder.read_text("index.json") == '{"shards": []}' and folder.read_bytes("missing") is None
    # S3's prefix rule: a partial name matches across "folders"
    assert objectstore.ObjectFolder("hf://datasets/org/tiny", stores=objectstore.SOURCES).list_keys("train") == \
        folder.list_keys()
    client = objectstore.client_for("hf://datasets/org/tiny")
    listed = client.list_objects_v2(Bucket="datasets", Prefix="org/tiny/train")["Contents"]
    assert [item["Key"] for item in listed] == ["org/tiny/train/index.json", "org/tiny/train/sub/shard.00000.mds",
                                                "org/tiny/trainer.txt"]
    got = folder.download("sub", tmp_path / "dl")
    assert (got / "shard.00000.mds").read_bytes() == bytes(range(256)) * 40

    # a revision (a branch or a commit) and the model spellings (hf://ORG/NAME, hf://models/ORG/NAME)
    for url in ("hf://datasets/org/tiny@main/train", f"hf://datasets/org/tiny@{FakeHub.commit('org/tiny')}/train"):
        pinned = objectstore.ObjectFolder(url, stores=objectstore.SOURCES)
        assert pinned.read_text("index.json") == '{"shards": []}'
        assert [k.split("/", 2)[2] for k in pinned.list_keys()] == ["train/index.json", "train/sub/shard.00000.mds"]
    for url in ("hf://org/model", "hf://models/org/model"):
        assert objectstore.ObjectFolder(url, stores=objectstore.SOURCES).read_text("config.json") == \
            '{"model_type": "gpt2"}'
    # the owner alone is a folder too: a model at a repo's root is downloaded from there
    owner = objectstore.ObjectFolder("hf://org", stores=objectstore.SOURCES)
    assert (owner.download("model", tmp_path / "m") / "config.json").exists()
    assert {method for method, _ in repos.requests} <= {"GET", "HEAD"}  # reads only


def test_missing_repos_revisions_and_files_are_one_line_errors(repos):
    where = repos.url
    for url, says in [("hf://datasets/org/nope/train", "repository 'hf://datasets/org/nope' was not found"),
                      ("hf://org/model@v9", "repository 'hf://org/model@v9' was not found"),
                      ("hf://org", "repository 'hf://org' was not found")]:
        with pytest.raises(Exception) as missing:
            objectstore.ObjectFolder(url, stores=objectstore.SOURCES).list_keys()
        assert str(objectstore.explain(missing.value, url, "load_path")) == (
            f"load_path: {says} at {where} (check its name and revision; a private or gated repo needs HF_TOKEN)")
    with pytest.raises(Exception) as missing:
        objectstore.download_file("hf://org/model/weights.bin", "/tmp/never", objectstore.SOURCES)
    assert str(objectstore.explain(missing.value, "hf://org/model/weights.bin", "load_path")) == (
        f"load_path: 'hf://org/model/weights.bin' was not found at {where} (check the path)")
    with pytest.raises(ConfigError, match=r"^MODEL: repository 'hf://org/nope' was not found at "):
        stage_model_path("hf://org/nope", "MODEL")  # convert, eval, generate


@pytest.mark.parametrize("url, says", [
    ("hf://", "'hf://' names no repository (write hf://datasets/ORG/NAME/path for a dataset, hf://ORG/NAME/path"),
    ("hf://datasets", "'hf://datasets' names no repository"),
    ("hf://buckets/org/b/x", "'hf://buckets/org/b/x': Hub storage buckets are not supported, only repos"),
])  # fmt: skip
def test_malformed_hf_urls_are_one_line_errors(url, says):
    with pytest.raises(ConfigError) as refused:
        objectstore.check_url(url, "load_path", objectstore.SOURCES)
    assert str(refused.value).startswith(f"load_path: {says}") and "\n" not in str(refused.value)


def test_writes_are_refused_by_every_key_that_writes_and_by_the_client(repos):
    for stores in (objectstore.CHECKPOINT_STORES, objectstore.DATA_STORES, (objectstore.S3,)):
        with pytest.raises(ConfigError) as refused:
            objectstore.check_url("hf://org/model/run", "save_folder", stores)
        assert str(refused.value) == (
            "save_folder: 'hf://org/model/run': hf:// is read-only here (it is read by load_path, a loader's remote "
            "and model paths (convert's input, eval, generate)); write to a local folder or another store, then "
            "upload it with `hf upload ORG/NAME FOLDER`")
    client = objectstore.client_for("hf://org/model")
    for write in (lambda: client.put_object(Bucket="org", Key="model/x", Body=b"1"),
                  lambda: client.delete_objects(Bucket="org", Delete={"Objects": [{"Key": "model/config.json"}]})):
        with pytest.raises(Exception, match="hf:// is read-only here"):
            write()
    assert {method for method, _ in repos.requests} <= {"GET", "HEAD"}


def test_offline_mode_is_a_one_line_error(repos, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as refused:
        objectstore.ObjectFolder("hf://org/model", "load_path", stores=objectstore.SOURCES)
    assert str(refused.value) == ("load_path: 'hf://org/model': HF_HUB_OFFLINE is set, so the Hub cannot be read "
                                  "(unset it, or download the files and give a local path)")


def test_streaming_downloads_hf_shards_through_our_client(repos, tmp_path):
    """streaming's own hf downloader knows dataset repos only, no revision, and leaves huggingface_hub's
    .cache/ folder in the loader's local folder; ours reads every repo URL with the client above."""
    download = import_streaming().base.storage.download
    local = tmp_path / "local"
    for remote in ("hf://datasets/org/tiny@main/train/sub/shard.00000.mds", "hf://org/model/config.json"):
        target = local / remote.rsplit("/", 1)[1]
        download.CloudDownloader.direct_download(remote, str(target))
        assert target.exists()
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "shard.00000.mds"]
    with pytest.raises(FileNotFoundError):  # what streaming reads as "missing" (no retries)
        download.CloudDownloader.direct_download("hf://org/model/missing.json", str(local / "missing.json"))
