"""Object-store URLs a path key cannot use are a one-line validation error, never a local folder: s3:// works
everywhere, gs://, Azure and oci:// for the top-level save_folder / load_path and a loader's remote, hf:// for
reading only (tests/train/test_hf_sources.py), the others nowhere yet."""

from __future__ import annotations

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import ICLTaskConfig
from llmfoundry.train.recipe import TrainConfig, validate

OTHER_STORES = ["gs://bucket/data", "oci://bucket@ns/data", "azure://container/data", "abfss://c@acct.dfs/x",
                "dbfs:/Volumes/data"]
FSSPEC = ("gs://", "azure://", "az://", "abfs://", "abfss://", "oci://")  # these work for checkpoints and data
NOT_GS = [url for url in OTHER_STORES if not url.startswith(FSSPEC)]


def _problems(cfg: dict) -> list[str]:
    with pytest.raises(ConfigError) as error:
        validate(cfg, TrainConfig)
    return error.value.problems


def _expected(key: str, url: str) -> str:
    scheme = url.split("://", 1)[0] + "://" if "://" in url else url.split(":", 1)[0] + ":"
    return f"{key}: '{url}': {scheme} object stores are not supported here"


@pytest.mark.parametrize("url", NOT_GS)
@pytest.mark.parametrize("key", ["save_folder", "load_path"])
def test_checkpoint_locations(recipe, key, url):
    said = [p for p in _problems(recipe(**{key: url})) if p.startswith(f"{key}:")]
    assert len(said) == 1 and said[0].startswith(_expected(key, url))


@pytest.mark.parametrize("url", NOT_GS)
@pytest.mark.parametrize("loader", ["train_loader", "eval_loader"])
def test_text_loader_remote(recipe, loader, url):
    base = recipe()
    dataset = {k: v for k, v in base[loader]["dataset"].items() if k != "local"}
    problems = _problems(recipe(**{loader: dict(base[loader], dataset=dict(dataset, remote=url))}))
    assert any(p.startswith(_expected(f"{loader}.dataset.remote", url)) for p in problems), problems


@pytest.mark.parametrize("url", ["wasb://c@acct/code", "dbfs:/Volumes/code"])
def test_stream_remote(recipe, url):
    base = recipe()
    dataset = {k: v for k, v in base["train_loader"]["dataset"].items() if k not in ("local", "split")}
    streams = {"web": {"remote": "s3://bucket/web", "split": "train"}, "code": {"remote": url, "split": "train"}}
    problems = _problems(recipe(train_loader=dict(base["train_loader"], dataset=dict(dataset, streams=streams))))
    assert [p.split(":", 1)[0] for p in problems] == ["train_loader.dataset.streams.code.remote"]
    assert problems[0].startswith(_expected("train_loader.dataset.streams.code.remote", url))


def test_finetuning_loader_remote(recipe):
    loader = {"name": "finetuning", "dataset": {"remote": "wasb://c@acct/ft", "split": "train", "max_seq_len": 32}}
    problems = _problems(recipe(train_loader=loader, eval_loader=None))
    assert any(p.startswith(_expected("train_loader.dataset.remote", "wasb://c@acct/ft")) for p in problems), problems


@pytest.mark.parametrize("root", ["gs://bucket", "azure://box", "az://box", "abfs://box", "abfss://box",
                                  "azure-dl://box", "oci://bucket", "oci://bucket@namespace"])
def test_gs_azure_and_oci_pass_for_checkpoints_and_loader_remotes(recipe, root):
    base = recipe()
    dataset = dict(base["train_loader"]["dataset"], remote=f"{root}/c4")
    validate(recipe(save_folder=f"{root}/run", load_path=f"{root}/run/ep0-ba2",
                    train_loader=dict(base["train_loader"], dataset=dataset)), TrainConfig)


def test_an_azure_url_with_its_account_in_it_says_how_to_write_it(recipe):
    said = [p for p in _problems(recipe(save_folder="abfss://c@acct.dfs/x")) if p.startswith("save_folder:")]
    assert said == ["save_folder: 'abfss://c@acct.dfs/x': the account goes in the environment, not the URL; write "
                    "abfss://c/x and set AZURE_STORAGE_ACCOUNT_NAME=acct (or AZURE_STORAGE_CONNECTION_STRING)"]


def test_s3_and_local_paths_pass(recipe):
    base = recipe()
    dataset = dict(base["train_loader"]["dataset"], remote="s3://bucket/c4")
    validate(recipe(save_folder="s3://bucket/run", load_path="s3://bucket/run/ep0-ba2",
                    train_loader=dict(base["train_loader"], dataset=dataset)), TrainConfig)


@pytest.mark.parametrize("url", ["gs://bucket/arc.jsonl", "oci://b@ns/arc.jsonl", "dbfs:/Volumes/arc.jsonl",
                                 "azure://c/arc.jsonl"])
def test_icl_dataset_uri(recipe, url):
    task = {"label": "arc", "dataset_uri": url, "icl_task_type": "multiple_choice", "num_fewshot": [0]}
    problems = _problems(recipe(icl_tasks=[task]))
    said = [p for p in problems if p.startswith("icl_tasks[0].dataset_uri: ")]
    assert len(said) == 1 and "object stores are not supported here" in said[0], said
    assert "use a local path, an s3:// URL or hf://" in said[0]


def test_icl_dataset_uri_may_be_a_hugging_face_dataset_or_s3():
    for uri in ("hf://allenai/ai2_arc", "s3://bucket/arc.jsonl", "eval/local_data/arc.jsonl"):
        validate({"label": "arc", "dataset_uri": uri, "icl_task_type": "multiple_choice", "num_fewshot": [0]},
                 ICLTaskConfig)
