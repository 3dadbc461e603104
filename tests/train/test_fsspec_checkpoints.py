"""Checkpoints on the stores answered through core/fsspec_store.py, each on its emulator (``fsspec_store``: gs:// on
gcp-storage-emulator, azure:// on Azurite): the S3 protocol (staged background uploads, completion markers,
``latest``, retention, autoresume), and one-line errors for what is not."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import autoresume_in_another_process, make_trainer, weights


def names(root: str, prefix: str) -> list[str]:
    folder = objectstore.ObjectFolder(f"{root}/{prefix}", stores=objectstore.CHECKPOINT_STORES)
    return [key.removeprefix(f"{prefix}/") for key in folder.list_keys()]


def test_a_save_folder_keeps_the_newest_and_autoresumes_bitwise(recipe, fsspec_store, tmp_path):
    url = f"{fsspec_store}/runs/a"

    def constant_lr(**kw):  # so that 6 batches + 2 resumed ones equal 8 straight ones
        return recipe(scheduler=None, eval_loader=None, **kw)

    make_trainer(constant_lr(max_duration="6ba", save_folder=url, save_interval="2ba",
                             save_num_checkpoints_to_keep=2,
                             checkpoint_upload={"staging_folder": str(tmp_path / "staging")})).fit()
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba4", "ep0-ba6"]
    assert folder.read_text("latest").strip() == "ep0-ba6"
    stored = names(fsspec_store, "runs/a")
    assert not [n for n in stored if n.startswith("ep0-ba2/")]  # retention deleted it, on this store too
    assert {"ep0-ba6/.metadata", "ep0-ba6/rank0.pt", "ep0-ba6/config.yaml", "ep0-ba6/.complete"} <= set(stored)

    resumed = make_trainer(constant_lr(max_duration="8ba", save_folder=url, save_interval="2ba", autoresume=True,
                                       checkpoint_upload={"staging_folder": str(tmp_path / "other")}))
    assert resumed.time.batch == 6
    resumed.fit()
    straight = make_trainer(constant_lr(max_duration="8ba"))
    straight.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    loaded = make_trainer(constant_lr(max_duration="8ba", load_path=f"{url}/ep0-ba4"))  # one checkpoint by URL
    assert loaded.time.batch == 4


def test_where_a_store_is_not_supported_yet_and_a_missing_bucket_are_one_line_errors(recipe, fsspec_store,
                                                                                     tmp_path):
    scheme = fsspec_store.split("://", 1)[0]
    plain = recipe(max_duration="1ba", callbacks={"mono_checkpoint_saver": {"save_folder": f"{fsspec_store}/mono",
                                                                           "batch_interval": 1}})
    with pytest.raises(ConfigError) as refused:
        validate(plain, TrainConfig)
    message = str(refused.value)
    assert "callbacks.mono_checkpoint_saver.save_folder" in message
    assert f"{scheme}:// works for the top-level save_folder and load_path, a loader's remote, hf_checkpointer" in message

    with pytest.raises(ConfigError, match=r"save_folder: bucket 'no-such-bucket' does not exist at http://127\.0"):
        make_trainer(recipe(max_duration="1ba", eval_loader=None, save_folder=f"{scheme}://no-such-bucket/run"))


@pytest.mark.parametrize("fsspec_store", ["gs"], indirect=True)  # Azure: test_fsspec_resume's ranks (time, #28)
def test_a_checkpoint_on_a_store_is_resumed_by_another_process(recipe, fsspec_store, tmp_path):
    """The command line, in a process of its own, reaches the store through the same variable (STORAGE_EMULATOR_HOST;
    AZURE_STORAGE_CONNECTION_STRING reaches the ranks of tests/distributed/test_fsspec_resume.py)."""
    url = f"{fsspec_store}/runs/cli"
    plain = recipe(max_duration="2ba", eval_loader=None, save_folder=url, save_interval="2ba")
    make_trainer(plain).fit()
    stdout = autoresume_in_another_process(plain, tmp_path)
    assert "resumed from" in stdout and "at batch 2" in stdout, stdout[-2000:]
    assert uploads.RemoteCheckpoints(url).read_text("latest").strip() == "ep0-ba3"


@pytest.mark.parametrize("url, package, extra", [("gs://b/run", "gcsfs", "gcs"), ("azure://box/run", "adlfs", "azure"),
                                                 ("abfss://box/run", "adlfs", "azure")])
def test_a_store_without_its_library_installed_says_which_extra_to_install(monkeypatch, url, package, extra):
    real = objectstore.importlib.util.find_spec
    monkeypatch.setattr(objectstore.importlib.util, "find_spec", lambda name: None if name == package else real(name))
    scheme = url.split("//")[0] + "//"
    with pytest.raises(ConfigError) as refused:
        objectstore.check_url(url, "save_folder", objectstore.CHECKPOINT_STORES)
    assert str(refused.value) == f"save_folder: '{url}': {scheme} needs {package} (pip install 'llmfoundry[{extra}]')"


@pytest.mark.parametrize("url, said", [
    ("abfss://box@acct.dfs.core.windows.net/runs/a", "write abfss://box/runs/a and set AZURE_STORAGE_ACCOUNT_NAME=acct"),
    ("azure://acct.blob.core.windows.net/box/run", "write azure://box/run and set AZURE_STORAGE_ACCOUNT_NAME=acct"),
    ("az://My_Box/run", "'My_Box' is not an Azure container name"),
])
def test_an_azure_url_naming_its_account_or_a_bad_container_is_a_one_line_error_saying_how_to_write_it(url, said):
    with pytest.raises(ConfigError) as refused:
        objectstore.check_url(url, "load_path", objectstore.CHECKPOINT_STORES)
    assert str(refused.value).startswith(f"load_path: '{url}': ") and said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_azure_without_an_account_is_a_one_line_error_naming_the_key_and_no_secret(monkeypatch):
    for name in ("CONNECTION_STRING", "ACCOUNT_NAME"):
        monkeypatch.delenv(f"AZURE_STORAGE_{name}", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "not-a-real-key-but-secret")
    with pytest.raises(ConfigError) as refused:
        objectstore.ObjectFolder("azure://box/run", "save_folder", stores=objectstore.CHECKPOINT_STORES)
    assert str(refused.value).startswith("save_folder: 'azure://box/run': no Azure storage account is set; set "
                                         "AZURE_STORAGE_CONNECTION_STRING")
    assert "not-a-real-key" not in str(refused.value)


@pytest.fixture(params=["gs", "azure", "oci"])
def model_store(request) -> str:
    """The root URL of an empty bucket on each store besides S3: gs:// and azure:// on their emulators, oci:// on
    the S3-compatibility stand-in."""
    if request.param == "oci":
        from tests.helpers import OCI_TEST_BUCKET

        request.getfixturevalue("oci_server")
        return f"oci://{OCI_TEST_BUCKET}"
    return _fsspec_root(request, request.param)


def _fsspec_root(request, scheme: str) -> str:
    from tests.helpers import AZURE_TEST_CONTAINER, GCS_TEST_BUCKET

    if scheme == "gs":
        request.getfixturevalue("gcs_server")
        return f"gs://{GCS_TEST_BUCKET}"
    request.getfixturevalue("azure_server")
    return f"azure://{AZURE_TEST_CONTAINER}"


def test_hf_checkpointer_exports_to_every_store_and_convert_and_load_read_them_there(recipe, model_store, tmp_path):
    """hf_checkpointer's save_folder, the model paths of convert/eval/generate (llmfoundry.loading) and convert's
    OUT_DIR on each store: the export goes up with its completion marker last, loads in place with our logits, and
    converts from that store into another folder of it."""
    from llmfoundry.cli import main
    from llmfoundry.loading import load_model

    model = dict(recipe()["model"], expansion_ratio=4, no_bias=True)  # what transformers' MptForCausalLM can hold
    trainer = make_trainer(recipe(
        eval_loader=None, max_duration="1ba", model=model, run_name="hf",
        checkpoint_upload={"staging_folder": str(tmp_path / "staging")},
        callbacks={"hf_checkpointer": {"save_folder": f"{model_store}/runs/{{run_name}}", "save_interval": "1ba"}}))
    trainer.fit()
    export = f"{model_store}/runs/hf/huggingface/ba1"
    stored = names(model_store, "runs/hf/huggingface/ba1")
    assert {"config.json", "model.safetensors", "tokenizer.json", uploads.COMPLETE} <= set(stored)
    ids = torch.tensor([[1, 5, 9, 13]])
    ours = trainer.model.eval()(ids).logits
    loaded, _ = load_model(export)
    torch.testing.assert_close(loaded(ids).logits, ours, rtol=1e-4, atol=1e-4)
    assert main(["convert", export, f"{model_store}/converted"]) == 0
    assert {"config.json", "model.safetensors", uploads.COMPLETE} <= set(names(model_store, "converted"))
