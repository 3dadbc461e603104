"""The converters' output (``--out_root`` / ``--output_folder``) on gs://, Azure and oci://, each on its emulator
(gcp-storage-emulator, Azurite, the OCI stand-in: moto behind a proxy refusing what OCI's S3 API refuses), as
tests/data/test_s3.py does for s3://: streaming's MDSWriter uploads through our clients
(data/streaming_stores.route_store_uploads), and the shards read back through a loader equal a local conversion's."""

from __future__ import annotations

import json

import pytest

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.prep.finetuning import main as finetuning_main
from llmfoundry.data.prep.json_data import main_json
from llmfoundry.data.prep.text import main as text_main
from llmfoundry.data.text import build_text_dataloader
from tests.helpers import (
    AZURE_TEST_CONTAINER,
    GCS_TEST_BUCKET,
    OCI_TEST_BUCKET,
    batch_rows,
    write_prompt_response_jsonl,
    write_text_folder,
)

pytestmark = pytest.mark.s3  # (the OCI stand-in is moto's S3 server)

STORES = {"gs": ("gcs_server", f"gs://{GCS_TEST_BUCKET}"),
          "azure": ("azure_server", f"az://{AZURE_TEST_CONTAINER}"),  # adlfs' spelling: streaming has none
          "oci": ("oci_server", f"oci://{OCI_TEST_BUCKET}@testns")}  # streaming's form, the namespace kept in the URL
MISSING = {"gs": "gs://no-such-bucket/mds", "azure": "az://no-such-container/mds",
           "oci": "oci://no-such-bucket/mds"}


@pytest.fixture(params=list(STORES))
def store(request, monkeypatch, tmp_path):
    """(name, root URL of an empty bucket) on each store in turn; the loader's cache in this test's folder."""
    server, root = STORES[request.param]
    request.getfixturevalue(server)
    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    yield request.param, root
    if request.param == "oci":
        assert request.getfixturevalue("oci_server").refused == []  # nothing OCI's S3 API would refuse was sent


def keys(url: str) -> list[str]:
    folder = objectstore.ObjectFolder(url, stores=objectstore.DATA_STORES)
    return [key.removeprefix(folder.key() + "/") for key in folder.list_keys()]


def read_json(url: str) -> dict:
    return json.loads(objectstore.read_bytes(url, objectstore.DATA_STORES))


def loader_rows(tokenizer, **dataset) -> list[tuple[int, ...]]:
    settings = TextLoaderSettings(dataset=TextDatasetSettings(split="train", max_seq_len=32, shuffle=True,
                                                              shuffle_seed=11, **dataset))
    return batch_rows(build_text_dataloader(settings, tokenizer, 4))


def test_jsonl_converted_onto_a_store_reads_back_as_the_local_conversion(store, tmp_path, corpus, tokenizer_dir,
                                                                         tokenizer):
    """The samples streamed back from the store are a local conversion's; converting into the same split again is
    refused, as for a local folder or s3://."""
    _, root = store
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": doc}) for doc in corpus[:80]))
    argv = ["json", "--path", str(jsonl), "--split", "train", "--concat_tokens", "32", "--tokenizer",
            str(tokenizer_dir), "--num_workers", "1", "--quiet"]
    from llmfoundry.data.prep.cli import main

    assert main([*argv, "--out_root", str(tmp_path / "local")]) == 0
    remote = f"{root}/mds"
    assert main([*argv, "--out_root", remote]) == 0
    written = keys(f"{remote}/train")
    assert "index.json" in written and any(k.endswith(".mds.zstd") for k in written)

    local = loader_rows(tokenizer, local=str(tmp_path / "local"))
    assert len(local) > 20
    assert loader_rows(tokenizer, remote=remote) == local
    with pytest.raises(ConfigError, match=r"mds/train: already holds an MDS dataset"):
        main_json([*argv[1:], "--out_root", remote])


def test_text_conversion_on_a_store_resumes_and_merges_one_index(store, tmp_path, corpus, tokenizer_dir, capsys):
    """The text converter's resumable groups on a store: an interrupted run picks up the groups not done, the
    merged index.json is the one of an uninterrupted run (and of the same conversion into a local folder), and
    other settings are refused without --reprocess (which test_prep.py follows on a local folder)."""
    _, root = store
    source = write_text_folder(tmp_path / "texts", corpus[:60])
    argv = ["--input_folder", str(source), "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir),
            "--processes", "2", "--files_per_group", "30", "--quiet"]  # forked workers upload
    out = f"{root}/text"
    assert text_main([*argv, "--output_folder", out]) == 0
    assert text_main([*argv, "--output_folder", str(tmp_path / "local")]) == 0
    complete = read_json(f"{out}/index.json")
    assert complete == json.loads((tmp_path / "local" / "index.json").read_text())  # shards, hashes, basenames
    assert {s["raw_data"]["basename"].split("/")[0] for s in complete["shards"]} == {"part-00000", "part-00001"}

    progress = read_json(f"{out}/llmfoundry_progress.json")
    del progress["done"]["1"]  # as if the run had died while converting group 1 (its shards are there: removed first)
    objectstore.write_bytes(f"{out}/llmfoundry_progress.json", json.dumps(progress).encode(), objectstore.DATA_STORES)
    folder = objectstore.ObjectFolder(out, stores=objectstore.DATA_STORES)
    folder.delete([folder.key("index.json")])
    capsys.readouterr()
    assert text_main([*argv, "--output_folder", out]) == 0
    assert "resuming: 1 of 2 groups" in capsys.readouterr().out
    assert read_json(f"{out}/index.json") == complete

    with pytest.raises(ConfigError, match="--output_folder: .*other settings.*--reprocess"):
        text_main([*argv[:3], "64", *argv[4:], "--output_folder", out])


def test_finetuning_local_keeps_a_copy_of_an_output_on_a_store(store, tmp_path, corpus, tokenizer_dir):
    _, root = store
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:20])
    examples = len(path.read_text().splitlines())
    assert finetuning_main(["--dataset", str(path), "--out_root", f"{root}/ft", "--local", str(tmp_path / "copy"),
                            "--tokenizer", str(tokenizer_dir), "--max_seq_len", "64", "--num_workers", "1"]) == 0
    remote = read_json(f"{root}/ft/train/index.json")
    local = json.loads((tmp_path / "copy" / "train" / "index.json").read_text())
    assert remote == local and sum(s["samples"] for s in local["shards"]) == examples
    assert set(keys(f"{root}/ft/train")) == {"index.json", *(s["zip_data"]["basename"] for s in local["shards"])}


def test_a_missing_bucket_and_an_input_on_the_store_are_one_line_errors_naming_the_flag(store, tmp_path,
                                                                                       tokenizer_dir):
    """A missing bucket is said before any tokenizing; the inputs (--input_folder, --path) are read from a local
    folder or s3:// only so far."""
    name, root = store
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    argv = ["--concat_tokens", "4", "--tokenizer", str(tokenizer_dir), "--quiet"]
    with pytest.raises(ConfigError, match=r"^--out_root: bucket 'no-such-(bucket|container)' does not exist at "):
        main_json(["--path", str(tmp_path / "d.jsonl"), "--out_root", MISSING[name], *argv])
    scheme = root.split("://")[0]
    with pytest.raises(ConfigError, match=rf"^--path: '{scheme}://[^']*': {scheme}:// object stores are not supported "
                                          r"here \(.*the converters' output so far\)"):
        main_json(["--path", f"{root}/d.jsonl", "--out_root", str(tmp_path / "o"), *argv])
    with pytest.raises(ConfigError, match=rf"^--input_folder: '{scheme}://[^']*': {scheme}:// object stores are not"):
        text_main(["--input_folder", f"{root}/texts", "--output_folder", str(tmp_path / "t"), *argv])
