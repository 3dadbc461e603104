"""``--ray``: the converters on a real local Ray cluster (2 CPUs, shared by the module) write the same samples as
the single-process converters, in the same order (compared by per-sample hashes), locally and on the moto S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys

import pytest

from llmfoundry.cli import run_main
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep import ray_data
from llmfoundry.data.prep.finetuning import main as finetuning_main
from llmfoundry.data.prep.json_data import main_hf, main_json
from llmfoundry.data.prep.text import main as text_main
from llmfoundry.data.streaming_guard import import_streaming
from tests.helpers import S3_TEST_BUCKET, write_prompt_response_jsonl

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")
RAY = ["--ray", "--ray-workers", "2", "--quiet"]
# Credentials the moto server accepts, in the environment the cluster starts with, as real nodes hold their own.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


@pytest.fixture(scope="module")
def ray_cluster():
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # start both worker processes and import the converters there once, so that no test pays for it (the function
    # travels by value: the workers cannot import this test module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.data.range(2, override_num_blocks=2).map_batches(_import_converters, num_cpus=1).take_all()
    yield
    ray.shutdown()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _import_converters(batch):
    import llmfoundry.data.prep.ray_data  # noqa: F401

    return batch


def sample_hashes(folder: str) -> list[str]:
    """sha256 of every sample's columns, in the order of the dataset's index (read by streaming)."""
    dataset = import_streaming().StreamingDataset(local=folder) if "://" not in folder else \
        import_streaming().StreamingDataset(remote=folder, local=os.path.join(os.environ["LLMFOUNDRY_STAGING_DIR"], "r"))
    hashes = []
    for i in range(len(dataset)):
        digest = hashlib.sha256()
        for name, value in sorted(dataset[i].items()):
            digest.update(name.encode() + value.tobytes())
        hashes.append(digest.hexdigest())
    return hashes


def index_summary(folder) -> tuple[int, set]:
    """Samples in the index, and the (column names, encodings, sizes, compression) its shards use."""
    shards = json.loads(open(os.path.join(folder, "index.json")).read())["shards"]
    formats = {(tuple(s["column_names"]), tuple(s["column_encodings"]), tuple(map(str, s["column_sizes"])),
                s["compression"]) for s in shards}
    return sum(s["samples"] for s in shards), formats


def wrote_line(capsys) -> str:
    """The converter's summary line, without the output folder."""
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")][-1]
    return re.sub(r" to \S+$", "", line)


def mixed_docs(corpus) -> list[str]:
    return [" ".join(corpus[i : i + 6]) if i % 7 == 0 else corpus[i] for i in range(60)]  # long (> 3 samples), short


@pytest.mark.parametrize("no_wrap", [False, True])
def test_json_with_ray_writes_the_single_process_samples_in_order(ray_cluster, tmp_path, corpus, tokenizer_dir,
                                                                  tokenizer, capsys, no_wrap):
    from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
    from llmfoundry.data.text import build_text_dataloader
    from tests.helpers import batch_rows

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in mixed_docs(corpus)))
    argv = ["--path", str(tmp_path / "d.jsonl"), "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir),
            *(["--no_wrap"] if no_wrap else [])]
    assert main_json([*argv, "--out_root", str(tmp_path / "one"), "--num_workers", "1", "--quiet"]) == 0
    single = wrote_line(capsys)
    assert main_json([*argv, "--out_root", str(tmp_path / "ray"), *RAY]) == 0
    assert wrote_line(capsys) == single  # the same documents, tokens and samples reported
    one, by_ray = str(tmp_path / "one" / "train"), str(tmp_path / "ray" / "train")
    assert sample_hashes(by_ray) == sample_hashes(one)
    assert index_summary(by_ray) == index_summary(one)
    blocks = [name for name in os.listdir(by_ray) if name.startswith("block-")]
    assert len(blocks) == 8  # 60 documents, 2 workers x 4 blocks: samples straddle the blocks' boundaries

    def rows(root):  # our training loader reads the merged index
        settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(root), split="train", max_seq_len=32))
        return batch_rows(build_text_dataloader(settings, tokenizer, 4))

    if not no_wrap:
        assert rows(tmp_path / "ray") == rows(tmp_path / "one")


def test_blocks_shorter_than_a_sample_still_give_the_single_process_samples(ray_cluster, tmp_path, corpus, tokenizer):
    """One document per block and 64-token samples: a sample is assembled from the carries of several blocks."""
    from llmfoundry.data.prep import common

    docs = corpus[:24]
    for no_wrap in (False, True):
        spec = common.ConcatSpec(64, bos_text="", eos_text=tokenizer.eos_token, no_wrap=no_wrap)
        one, by_ray = str(tmp_path / f"one{no_wrap}"), str(tmp_path / f"ray{no_wrap}")
        expected = common.write_concatenated(docs, tokenizer, one, spec, show_progress=False)
        got = ray_data.write_concatenated([docs], tokenizer, by_ray, spec, workers=2, per_block=1)
        assert {k: got[k] for k in expected} == expected and expected["samples"] > 5
        assert sample_hashes(by_ray) == sample_hashes(one)


def test_text_folder_with_ray_keeps_the_groups_of_files(ray_cluster, tmp_path, text_folder, tokenizer_dir, capsys):
    argv = ["--input_folder", str(text_folder), "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir),
            "--files_per_group", "50", "--eos_text", ""]
    assert text_main([*argv, "--output_folder", str(tmp_path / "one"), "--processes", "1", "--quiet"]) == 0
    single = wrote_line(capsys)
    # 4 groups of 50 files (each concatenated on its own, as on one machine), 25 files per block: 2 blocks per group
    assert text_main([*argv, "--output_folder", str(tmp_path / "ray"), *RAY]) == 0
    assert wrote_line(capsys) == single
    assert sample_hashes(str(tmp_path / "ray")) == sample_hashes(str(tmp_path / "one"))
    assert index_summary(tmp_path / "ray") == index_summary(tmp_path / "one")
    with pytest.raises(ConfigError, match="already holds a conversion .*--reprocess"):
        text_main([*argv, "--output_folder", str(tmp_path / "ray"), *RAY])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # a worker fails to read it
    assert run_main(text_main, [*argv[2:], "--input_folder", str(tmp_path / "bad"),
                                "--output_folder", str(tmp_path / "bad-out"), *RAY]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: \S*latin1\.txt: not UTF-8 text \(byte 3\); convert it or remove it", err), err


def test_hf_dataset_with_ray_writes_the_single_process_samples_in_order(ray_cluster, tmp_path, corpus, tokenizer_dir,
                                                                        capsys):
    import datasets

    datasets.Dataset.from_dict({"text": mixed_docs(corpus)}).save_to_disk(str(tmp_path / "hf"))
    argv = ["--dataset", str(tmp_path / "hf"), "--splits", "train", "--concat_tokens", "32",
            "--tokenizer", str(tokenizer_dir)]
    assert main_hf([*argv, "--out_root", str(tmp_path / "one"), "--num_workers", "1", "--quiet"]) == 0
    single = wrote_line(capsys)
    assert main_hf([*argv, "--out_root", str(tmp_path / "ray"), *RAY]) == 0
    assert wrote_line(capsys) == single
    assert sample_hashes(str(tmp_path / "ray" / "train")) == sample_hashes(str(tmp_path / "one" / "train"))


def test_finetuning_with_ray_writes_the_same_examples_in_order(ray_cluster, tmp_path, corpus, tokenizer_dir, tokenizer,
                                                               capsys):
    from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
    from llmfoundry.data.loader_settings import FinetuningDatasetSettings, FinetuningLoaderSettings

    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:80])
    argv = ["--dataset", str(path), "--tokenizer", str(tokenizer_dir), "--max_seq_len", "10", "--splits", "train"]
    assert finetuning_main([*argv, "--out_root", str(tmp_path / "one"), "--num_workers", "1"]) == 0
    single = wrote_line(capsys)
    assert finetuning_main([*argv, "--out_root", str(tmp_path / "ray"), *RAY[:-1]]) == 0
    assert wrote_line(capsys) == single and not single.endswith("(0 dropped by truncation)")
    one, by_ray = str(tmp_path / "one" / "train"), str(tmp_path / "ray" / "train")
    assert sample_hashes(by_ray) == sample_hashes(one)
    assert index_summary(by_ray) == index_summary(one)

    def labels(root):
        ds = FinetuningDatasetSettings(local=str(root), split="train", max_seq_len=10)
        return [b["labels"].tolist() for b in build_finetuning_dataloader(FinetuningLoaderSettings(dataset=ds),
                                                                          tokenizer, 4)]

    assert labels(tmp_path / "ray") == labels(tmp_path / "one")


@pytest.mark.s3
def test_json_with_ray_to_s3_streams_back_the_single_process_samples(ray_cluster, s3_server, tmp_path, corpus,
                                                                     tokenizer_dir, tokenizer, monkeypatch):
    import boto3

    from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
    from llmfoundry.data.text import build_text_dataloader
    from tests.helpers import batch_rows

    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in corpus[:60]))
    argv = ["--path", str(tmp_path / "d.jsonl"), "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir)]
    assert main_json([*argv, "--out_root", str(tmp_path / "one"), "--num_workers", "1", "--quiet"]) == 0
    remote = f"s3://{S3_TEST_BUCKET}/mds"
    assert main_json([*argv, "--out_root", remote, *RAY]) == 0
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=S3_TEST_BUCKET)["Contents"]]
    assert "mds/train/index.json" in keys and any(re.match(r"mds/train/block-\d+/shard\.", k) for k in keys)
    assert sample_hashes(f"{remote}/train") == sample_hashes(str(tmp_path / "one" / "train"))

    def rows(**where):
        settings = TextLoaderSettings(dataset=TextDatasetSettings(split="train", max_seq_len=32, **where))
        return batch_rows(build_text_dataloader(settings, tokenizer, 4))

    assert rows(remote=remote) == rows(local=str(tmp_path / "one"))


def test_json_with_ray_to_gs_writes_the_single_process_samples(ray_cluster, gcs_server, tmp_path, corpus,
                                                               tokenizer_dir):
    """The workers upload to gs:// through our client (STORAGE_EMULATOR_HOST reaches them with the endpoints: the
    cluster started without it)."""
    from tests.helpers import GCS_TEST_BUCKET

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in corpus[:60]))
    argv = ["--path", str(tmp_path / "d.jsonl"), "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir)]
    assert main_json([*argv, "--out_root", str(tmp_path / "one"), "--num_workers", "1", "--quiet"]) == 0
    remote = f"gs://{GCS_TEST_BUCKET}/mds"
    assert main_json([*argv, "--out_root", remote, *RAY]) == 0
    assert sample_hashes(f"{remote}/train") == sample_hashes(str(tmp_path / "one" / "train"))


def test_bad_ray_flag_combinations_are_one_line_errors(tmp_path, tokenizer_dir, capsys, monkeypatch):
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    json_argv = ["--path", str(tmp_path / "d.jsonl"), "--out_root", str(tmp_path / "o"), "--tokenizer", str(tokenizer_dir)]
    cases = [
        (main_json, [*json_argv, "--concat_tokens", "4", "--ray-workers", "2"], "--ray-workers: only used with --ray"),
        (main_json, [*json_argv, "--concat_tokens", "4", "--ray", "--num_workers", "2"], "--num_workers: not with --ray"),
        (main_json, [*json_argv[:4], "--ray"], "--ray: tokenizes on a Ray cluster; add --concat_tokens"),
        (main_json, [*json_argv, "--concat_tokens", "4", "--ray", "--ray-workers", "0"], "--ray-workers: expected >= 1"),
        (text_main, ["--input_folder", str(tmp_path), "--output_folder", str(tmp_path / "t"), "--concat_tokens", "4",
                     "--tokenizer", str(tokenizer_dir), "--ray", "--processes", "2"], "--processes: not with --ray"),
        (finetuning_main, ["--dataset", str(tmp_path / "d.jsonl"), "--out_root", "s3://b/ft", "--local", str(tmp_path),
                           "--tokenizer", str(tokenizer_dir), "--max_seq_len", "8", "--ray"], "--local: not with --ray"),
    ]
    for main, argv, message in cases:
        assert run_main(main, argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {message}") and "\n" not in err, err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert run_main(main_json, [*json_argv, "--concat_tokens", "4", "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'llmfoundry[ray]'" in err and "\n" not in err
