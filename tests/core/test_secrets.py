"""What counts as a secret, how text and command lines are masked, and how the launchers turn secrets into job
variables (llmfoundry/core/secrets.py, llmfoundry/launch/recipe.py)."""

from __future__ import annotations

import io

import pytest

from llmfoundry.core import secrets
from llmfoundry.core.secrets import (
    MASK,
    MaskedStream,
    env_name_for,
    find_secrets,
    is_secret_key,
    mask_argv,
    mask_secrets,
    mask_text,
)
from llmfoundry.launch.recipe import secrets_to_env


@pytest.mark.parametrize("key", ["hf_token", "token", "auth_token", "api_key", "password", "AWS_SECRET_ACCESS_KEY",
                                 "private_key", "client_secret"])
def test_keys_that_hold_a_credential(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["max_tokens", "eos_token", "pad_token", "bos_token_id", "tokenizer", "author",
                                 "tokens_per_expert", "accumulate_train_batch_on_tokens", "TOKENIZERS_PARALLELISM",
                                 "token_type_ids", "max_new_tokens"])
def test_keys_that_do_not(key):
    assert not is_secret_key(key)


def test_a_credential_variable_of_the_environment_is_masked_anywhere_in_text(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "abcdefghijklmnop")
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "qrstuvwxyz012345")
    monkeypatch.setenv("SOME_FLAG", "abcdefghijklmnopqrs")  # not a credential variable: its value stays
    text = "a abcdefghijklmnop b qrstuvwxyz012345 c abcdefghijklmnopqrs"
    assert mask_text(text) == f"a {MASK} b {MASK} c {MASK}qrs"  # the HF_TOKEN value inside the flag's is masked
    monkeypatch.setenv("AUTH_MODE", "on")  # too short to search for: "on" stays everywhere
    assert mask_text("on and on") == "on and on"


def test_remembered_values_tokens_and_url_credentials_are_masked_in_text():
    secrets.remember(["remembered-value-123"])
    text = ("error: max_duration: 'remembered-value-123' is not a time; see hf_" + "a" * 24 +
            " and https://me:pw-1234@host/x?sig=abcd")
    assert mask_text(text) == f"error: max_duration: '{MASK}' is not a time; see {MASK} and https://{MASK}@host/x?sig={MASK}"


def test_azure_credentials_are_masked_from_the_environment_and_in_a_quoted_connection_string(monkeypatch):
    key = "c2VjcmV0LWFjY291bnQta2V5LWJhc2U2NA=="
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
                 "AZURE_STORAGE_CLIENT_SECRET", "AZURE_ACCOUNT_ACCESS_KEY"):
        monkeypatch.setenv(name, f"{name.lower()}-value-{key}")
        assert mask_text(f"said: {name.lower()}-value-{key}.") == f"said: {MASK}."
        monkeypatch.delenv(name)
    # not in the environment (a string a library quoted): the key and SAS fields alone are masked
    quoted = (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={key};EndpointSuffix=core.windows.net "
              "and SharedAccessSignature=sv=2024&sig=abc123")
    assert mask_text(quoted) == (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={MASK};"
                                 f"EndpointSuffix=core.windows.net and SharedAccessSignature={MASK}")
    assert find_secrets({"variables": {"store": f"AccountName=a;AccountKey={key}"}}) == {key: "variables.store"}


def test_the_oci_customer_secret_key_is_masked_from_the_environment(monkeypatch):
    for name in ("OCI_S3_ACCESS_KEY_ID", "OCI_S3_SECRET_ACCESS_KEY"):
        assert name in secrets.SECRET_ENV_VARS
        monkeypatch.setenv(name, f"{name.lower()}-value-0f3a9c")
        assert mask_text(f"said: {name.lower()}-value-0f3a9c.") == f"said: {MASK}."
        assert env_name_for(f"{name.lower()}-value-0f3a9c", "variables.key") == name


def test_mask_secrets_masks_by_key_format_url_and_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-the-env-123")
    config = {"hf_token": "x" * 10, "n": 3, "kw": {"token": 5}, "note": "uses from-the-env-123",
              "url": "s3://id:key@minio/b", "eos_token": "</s>"}
    assert mask_secrets(config) == {"hf_token": MASK, "n": 3, "kw": {"token": MASK}, "note": f"uses {MASK}",
                                    "url": f"s3://{MASK}@minio/b", "eos_token": "</s>"}


def test_mask_argv_masks_secret_overrides_whatever_the_prefix():
    argv = ["train", "r.yaml", "+variables.hf_token=abc", "++x.api_key=zzzzzzzzzz", "max_duration=10ba",
            "load_path=https://u:p-123456@h/x"]
    assert mask_argv(argv) == ["train", "r.yaml", f"+variables.hf_token={MASK}", f"++x.api_key={MASK}",
                               "max_duration=10ba", f"load_path=https://{MASK}@h/x"]


def test_find_secrets_names_where_each_secret_is(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "env-held-value-1")
    recipe = {"variables": {"hf_token": "given-on-cli-1", "copy": "env-held-value-1",
                            "mirror": "https://user:url-pass-123@h/d?token=query-tok-1"}, "seed": 3}
    assert find_secrets(recipe) == {"given-on-cli-1": "variables.hf_token", "env-held-value-1": "variables.copy",
                                    "url-pass-123": "variables.mirror", "query-tok-1": "variables.mirror"}
    assert env_name_for("given-on-cli-1", "variables.hf_token") == "HF_TOKEN"
    assert env_name_for("env-held-value-1", "variables.copy") == "HF_TOKEN"
    assert env_name_for("url-pass-123", "variables.mirror") == "LLMFOUNDRY_SECRET_VARIABLES_MIRROR"


def test_secrets_to_env_leaves_interpolations_that_give_back_the_same_recipe(monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setenv("HF_TOKEN", "env-held-value-1")
    recipe = {"variables": {"hf_token": "given-on-cli-1", "copy": "env-held-value-1",
                            "mirror": "https://user:url-pass-123@h/d"},
              "tokenizer": {"kwargs": {"token": "given-on-cli-1"}}, "seed": 3}
    written, env, where = secrets_to_env(recipe)
    assert written["variables"]["hf_token"] == written["tokenizer"]["kwargs"]["token"] == "${oc.env:HF_TOKEN}"
    assert env["HF_TOKEN"] == "given-on-cli-1"  # the key named like the variable wins the name
    assert where["HF_TOKEN"] == "variables.hf_token"
    assert not any(value in str(written) for value in env.values())
    for name, value in env.items():  # the job's environment
        monkeypatch.setenv(name, value)
    assert OmegaConf.to_container(OmegaConf.create(written), resolve=True) == recipe


def test_a_masked_stream_masks_what_a_later_write_hook_sees():
    secrets.remember(["stream-secret-123"])
    target = io.StringIO()
    stream = MaskedStream(target)
    captured = []
    original = stream.write

    def capturing_write(text):  # what wandb does to sys.stdout to copy the console into its run file
        captured.append(text)
        return original(text)

    stream.write = capturing_write
    assert stream.write("loss 1.0 stream-secret-123\n") == len("loss 1.0 stream-secret-123\n")
    assert captured == [f"loss 1.0 {MASK}\n"] and target.getvalue() == f"loss 1.0 {MASK}\n"


def test_a_flow_mapping_override_is_masked_on_the_command_line(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "argv", ["llmfoundry", "train", "r.yaml", "variables={api_key: flowmapped-secret1}"])
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # put back whatever protect_process wraps
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    secrets.protect_process(sys.argv[1:])
    assert sys.argv[-1] == f"variables={{api_key: {MASK}}}"


def test_secrets_to_env_changes_nothing_but_the_secrets(monkeypatch):
    """Numbers equal to a secret's text, a short secret, a path with backslashes and the run name stay as they are;
    the job's environment gives back the recipe."""
    from omegaconf import OmegaConf

    monkeypatch.setenv("HF_TOKEN", "env-held-value-1")
    recipe = {"variables": {"token_limit": 2048, "auth_mode": "oc", "path": "C:\\dir\\env-held-value-1"},
              "max_seq_len": 2048, "run_name": "oc-run", "mirror": "oci://bucket@namespace/data"}
    written, env, _ = secrets_to_env(recipe)
    assert written["max_seq_len"] == 2048 and written["run_name"] == "oc-run"
    assert written["mirror"] == recipe["mirror"]  # bucket@namespace is no credential
    assert written["variables"]["auth_mode"] == "${oc.env:LLMFOUNDRY_SECRET_VARIABLES_AUTH_MODE}"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert OmegaConf.to_container(OmegaConf.create(written), resolve=True) == recipe


def test_a_run_name_holding_a_secret_is_refused_masked():
    from llmfoundry.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"run_name: 'run-\*\*\*\*\*\*\*\*' holds a secret"):
        secrets_to_env({"variables": {"hf_token": "runsecret-123"}, "run_name": "run-runsecret-123"})


def test_a_mapping_under_a_secret_key_is_secret_throughout():
    config = {"credentials": {"account_name": "acct-name-1", "account_key": "k-123456789"}, "note": "x"}
    assert mask_secrets(config) == {"credentials": {"account_name": MASK, "account_key": MASK}, "note": "x"}
    assert set(find_secrets(config)) == {"acct-name-1", "k-123456789"}


@pytest.mark.parametrize("url", ["oci://bucket@namespace/data", "git+ssh://git@github.com/x",
                                 "http://localhost:5000/models/foo@latest", "https://hub/?author=mosaicml&design=a1"])
def test_urls_without_credentials_are_left_alone(url):
    assert mask_text(url) == url and find_secrets({"path": url}) == {}


@pytest.mark.parametrize("key", ["neptune_api_token", "npm_token", "endpoint_token", "hf_new_token", "NGROK_AUTHTOKEN",
                                 "account_key", "connection_string"])
def test_tokens_of_keys_that_start_like_special_tokens_are_secret(key):
    assert is_secret_key(key)
