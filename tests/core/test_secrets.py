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
