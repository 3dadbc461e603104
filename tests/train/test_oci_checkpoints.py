"""oci:// checkpoints through OCI's S3 compatibility API, on its stand-in (``oci_server``: moto behind a proxy that
refuses CRC checksum headers and requests signed with another key or region), and the one-line errors for a set-up
that is missing a piece (no server needed)."""

from __future__ import annotations

import os
import re

import pytest
import torch

from llmfoundry.core import objectstore, oci
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import OCI_TEST_BUCKET, autoresume_in_another_process, make_trainer, weights


@pytest.mark.s3
def test_an_oci_save_folder_is_resumed_bitwise_by_another_process(recipe, oci_server, tmp_path):
    url = f"oci://{OCI_TEST_BUCKET}/runs/a"
    plain = recipe(scheduler=None, eval_loader=None, max_duration="2ba", save_folder=url, save_interval="1ba",
                   save_num_checkpoints_to_keep=1)
    make_trainer(plain).fit()
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba2"]  # retention deleted ep0-ba1 (a batched delete on OCI too)
    assert folder.read_text("latest").strip() == "ep0-ba2"

    stdout = autoresume_in_another_process(plain, tmp_path)
    assert "resumed from" in stdout and "at batch 2" in stdout, stdout[-2000:]
    assert folder.read_text("latest").strip() == "ep0-ba3"

    loaded = make_trainer(recipe(scheduler=None, eval_loader=None, max_duration="3ba", load_path=f"{url}/ep0-ba3"))
    straight = make_trainer(recipe(scheduler=None, eval_loader=None, max_duration="3ba"))
    straight.fit()
    expected, got = weights(straight), weights(loaded)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert oci_server.refused == []  # no checksum header, the OCI key and region on every request of both processes


@pytest.mark.s3
def test_a_missing_oci_bucket_and_a_missing_key_are_one_line_errors(recipe, oci_server):
    with pytest.raises(ConfigError, match=r"^save_folder: bucket 'no-such-bucket' does not exist at http://127\.0"):
        make_trainer(recipe(max_duration="1ba", eval_loader=None, save_folder="oci://no-such-bucket/run"))
    os.environ["OCI_S3_ACCESS_KEY_ID"] = "another-key"  # (monkeypatched by the fixture: restored after the test)
    with pytest.raises(ConfigError, match=r"^save_folder: access to 'oci://.*' was refused \(InvalidAccessKeyId\); "
                                          r"check OCI_S3_ACCESS_KEY_ID"):
        make_trainer(recipe(max_duration="1ba", eval_loader=None, save_folder=f"oci://{OCI_TEST_BUCKET}/run"))


@pytest.mark.s3
def test_the_stand_in_refuses_what_oci_refuses_and_our_client_sends_none_of_it(oci_server):
    import boto3

    plain = boto3.client("s3", endpoint_url=oci_server.url, region_name="us-ashburn-1",
                         aws_access_key_id="oci-test-key-id", aws_secret_access_key="x")
    with pytest.raises(Exception, match="InvalidArgument"):  # boto3's default CRC checksum headers
        plain.put_object(Bucket=OCI_TEST_BUCKET, Key="x", Body=b"1")
    objectstore.write_bytes(f"oci://{OCI_TEST_BUCKET}/x", b"1", stores=objectstore.CHECKPOINT_STORES)
    assert [code for _, _, code in oci_server.refused] == ["InvalidArgument"]


# ------------------------------------------------------------------------------------- set-up errors (no server)
@pytest.fixture
def no_oci(monkeypatch, tmp_path):
    for name in ("OCI_S3_ENDPOINT_URL", "OCI_NAMESPACE", "OCI_REGION", "OCI_S3_ACCESS_KEY_ID",
                 "OCI_S3_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "OCI_CLI_PROFILE",
                 "OCI_CLI_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OCI_CONFIG_FILE", str(tmp_path / "oci-config"))
    return tmp_path / "oci-config"


def _client_error(url: str = "oci://bucket/run") -> str:
    with pytest.raises(ConfigError) as refused:
        objectstore.ObjectFolder(url, "save_folder", stores=objectstore.CHECKPOINT_STORES)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_each_missing_piece_of_the_oci_set_up_is_named(no_oci, monkeypatch):
    assert "set OCI_S3_ENDPOINT_URL=https://<namespace>.compat.objectstorage.<region>.oraclecloud.com, or " \
           "OCI_NAMESPACE and OCI_REGION" in _client_error()
    monkeypatch.setenv("OCI_NAMESPACE", "mytenancy")
    assert "no OCI region: set OCI_REGION" in _client_error()
    monkeypatch.delenv("OCI_NAMESPACE")
    monkeypatch.setenv("OCI_REGION", "us-ashburn-1")
    assert "no Object Storage namespace: set OCI_NAMESPACE" in _client_error()
    assert "customer secret key" in _client_error("oci://bucket@mytenancy/run")  # the URL's namespace is enough
    monkeypatch.setenv("OCI_S3_ACCESS_KEY_ID", "id-only")
    assert "OCI_S3_SECRET_ACCESS_KEY is not set" in _client_error("oci://bucket@mytenancy/run")
    assert _client_error().startswith("save_folder: 'oci://bucket/run': ")


def test_the_endpoint_comes_from_namespace_and_region_or_the_oci_config_file(no_oci, monkeypatch):
    no_oci.write_text("[DEFAULT]\nuser=ocid1.user.oc1..x\nregion=eu-frankfurt-1\n[OTHER]\nregion=ap-tokyo-1\n")
    monkeypatch.setenv("OCI_NAMESPACE", "MyTenancy")
    assert oci.endpoint("oci://b/x") == "https://mytenancy.compat.objectstorage.eu-frankfurt-1.oraclecloud.com"
    monkeypatch.setenv("OCI_CLI_PROFILE", "OTHER")
    assert oci.endpoint("oci://b@other/x") == "https://other.compat.objectstorage.ap-tokyo-1.oraclecloud.com"
    monkeypatch.setenv("OCI_REGION", "us-phoenix-1")  # the variable over the file
    assert oci.endpoint("oci://b/x").endswith(".us-phoenix-1.oraclecloud.com")

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "aws-id")  # the AWS_* pair serves when no OCI_S3_* is set
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    s3 = objectstore.client_for("oci://b/x")
    assert s3.meta.endpoint_url == "https://mytenancy.compat.objectstorage.us-phoenix-1.oraclecloud.com"
    assert s3.meta.region_name == "us-phoenix-1" and s3.meta.config.s3["addressing_style"] == "path"
    assert s3.meta.config.request_checksum_calculation == "when_required"
    assert s3._request_signer._credentials.access_key == "aws-id"

    explicit = "https://mytenancy.compat.objectstorage.sa-saopaulo-1.oraclecloud.com"
    monkeypatch.setenv("OCI_S3_ENDPOINT_URL", explicit)  # its region signs the requests
    assert oci.settings("oci://b/x").region == "sa-saopaulo-1"
    with pytest.raises(oci.NotConfigured, match="namespace 'other' is not that of OCI_S3_ENDPOINT_URL"):
        oci.settings("oci://b@other/x")


@pytest.mark.parametrize("url, says", [
    ("oci://bad bucket/x", "'bad bucket' is not an OCI bucket name"),
    ("oci://b@not_a.namespace/x", "'not_a.namespace' is not an Object Storage namespace"),
    ("oci:///x", "has no bucket (use oci://bucket/path)"),
])  # fmt: skip
def test_malformed_oci_urls_are_one_line_errors(url, says):
    with pytest.raises(ConfigError, match=rf"^load_path: .*{re.escape(says)}"):
        objectstore.check_url(url, "load_path", objectstore.CHECKPOINT_STORES)


def test_both_url_forms_validate_and_oci_elsewhere_is_a_one_line_refusal(recipe):
    for url in ("oci://bucket/run", "oci://bucket@namespace/run"):
        validate(recipe(save_folder=url, load_path=url), TrainConfig)
    assert objectstore.split_url("oci://bucket@ns/a/b/", stores=objectstore.DATA_STORES) == ("bucket", "a/b")
    plain = recipe(max_duration="1ba", callbacks={"mono_checkpoint_saver": {"save_folder": "oci://b/mono",
                                                                           "batch_interval": 1}})
    with pytest.raises(ConfigError, match="callbacks.mono_checkpoint_saver.save_folder.*oci:// works for the "
                                          "top-level save_folder and load_path, a loader's remote"):
        validate(plain, TrainConfig)
