"""``llmfoundry convert``'s checks up front: destinations that cannot be written are one-line errors before any
model is loaded (light: no torch or transformers)."""

from __future__ import annotations

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HFValidationError, LocalTokenNotFoundError
from huggingface_hub.utils import validate_repo_id

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, first_line

FILE_URL = "file://"  # an --hf_repo_for_upload that is a local folder: a Hub stand-in that needs no network


def check_outputs(out_dir: str, repo: str | None, test_uploaded: bool) -> None:
    """One-line errors for destinations that cannot be written, raised before any model is loaded."""
    if objectstore.is_remote(out_dir):
        try:
            objectstore.ObjectFolder(out_dir, "OUT_DIR", max_attempts=3, stores=objectstore.CHECKPOINT_STORES).probe()
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - botocore: no credentials, no endpoint, no bucket, ...
            raise objectstore.explain(error, out_dir, "OUT_DIR") from None
    if test_uploaded and repo is None:
        raise ConfigError("--test_uploaded_model: there is no uploaded model to test (add --hf_repo_for_upload REPO, "
                          "or drop --test_uploaded_model)")
    if repo is not None and not repo.startswith(FILE_URL):
        check_hub(repo)


def check_hub(repo: str) -> None:
    """That ``repo`` is a valid Hub repo id and that the Hub answers with a token (HfApi.whoami): the upload
    needs both, and finding out after the conversion would waste it."""
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ConfigError(f"--hf_repo_for_upload: '{repo}' is not a Hugging Face repo id ({first_line(error)}); "
                          f"use owner/name, or a {FILE_URL} URL for a local folder") from None
    if constants.is_offline_mode():
        raise ConfigError("--hf_repo_for_upload: the Hugging Face Hub cannot be reached: HF_HUB_OFFLINE is set (run "
                          "on a machine with network access and HF_HUB_OFFLINE unset, or upload OUT_DIR later)")
    api = HfApi()
    try:
        api.whoami()
    except LocalTokenNotFoundError:
        raise ConfigError("--hf_repo_for_upload: no Hugging Face token (run `hf auth login` or set HF_TOKEN)") from None
    except Exception as error:  # noqa: BLE001 - httpx/requests connection errors, HTTP 401, ...
        raise ConfigError(f"--hf_repo_for_upload: the Hugging Face Hub at {api.endpoint} did not accept the token or "
                          f"cannot be reached ({type(error).__name__}: {first_line(error)}); check the network and "
                          "HF_TOKEN") from None
