"""llm-foundry's finetuning recipes that load from ``oci://`` (``1b_local_data_sft.yaml``, ``7b_dolly_sft.yaml``):
they validate as written, with no OCI set-up at all, and a run of their tiny equivalent with the recipe's own
``load_path`` goes to the OCI stand-in (``oci_server``: moto behind a proxy refusing what OCI's S3 API refuses):
a missing checkpoint is one line naming the URL, and a checkpoint placed at that URL is the one loaded."""

from __future__ import annotations

import pytest
import torch
import yaml

from tests.recipes.llm_foundry_keys import (
    LocalData,
    load_inventory,
    tiny_equivalent,
    unflatten,
)

RECIPES = {"scripts/train/yamls/finetune/1b_local_data_sft.yaml":
           "oci://my-bucket/my-folder/mpt-1b/checkpoints/some_checkpoint.pt",
           "scripts/train/yamls/finetune/7b_dolly_sft.yaml":
           "oci://my-bucket/my-folder/mpt-7b/checkpoints/some_checkpoint.pt"}


@pytest.fixture(scope="module")
def local_data(tmp_path_factory, tokenizer_dir, mds_root) -> LocalData:
    return LocalData(tmp_path_factory.mktemp("llm-foundry-oci"), tokenizer_dir, mds_root)


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_recipe_validates_as_written(name, tmp_path, monkeypatch, capsys):
    from llmfoundry import cli

    for variable in ("OCI_S3_ENDPOINT_URL", "OCI_NAMESPACE", "OCI_REGION", "OCI_S3_ACCESS_KEY_ID"):
        monkeypatch.delenv(variable, raising=False)  # checking a recipe needs no store set-up
    recipe = unflatten(load_inventory()["recipes"][name])
    assert recipe["load_path"] == RECIPES[name]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli.main(["check", str(path)]) == 0, capsys.readouterr().err[-2000:]


@pytest.mark.s3
@pytest.mark.parametrize("name", list(RECIPES))
def test_a_run_of_the_recipe_reads_its_oci_load_path_from_the_stand_in(name, oci_server, local_data, tmp_path,
                                                                       capsys):
    from llmfoundry import cli
    from llmfoundry.commands.train import load_train_config
    from llmfoundry.core import objectstore
    from llmfoundry.train.trainer import Trainer
    from tests.conftest import OCI_TEST_REGION
    from tests.helpers import weights

    url = RECIPES[name]
    recipe = {**tiny_equivalent(name, local_data, tmp_path), "load_path": url, "max_duration": "1ba"}
    store = objectstore.client_for(url)  # our client for OCI's S3 API (the stand-in's key and region)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert cli.main(["train", str(path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"error: load_path: '{url}' was not found at {oci_server.url} (check the path)", error
    store.create_bucket(Bucket="my-bucket", CreateBucketConfiguration={"LocationConstraint": OCI_TEST_REGION})

    # a Composer checkpoint (weights only, as load_weights_only reads) at the recipe's URL is the one loaded
    fresh = Trainer(*load_train_config(str(path), ["load_path=null"]))
    saved = {k: torch.full_like(v, 0.25) if v.is_floating_point() else v for k, v in weights(fresh).items()}
    file = tmp_path / "some_checkpoint.pt"
    torch.save({"state": {"model": {f"model.{k}": v for k, v in saved.items()}}, "rng": []}, file)
    store.upload_file(str(file), "my-bucket", url.split("my-bucket/", 1)[1])
    loaded = weights(Trainer(*load_train_config(str(path), [])))
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert oci_server.refused == []
