"""`llmfoundry convert CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--hf_repo_for_upload REPO [--test_uploaded_model]]`:
export a model to a transformers-native folder (or, with ``--recipe RECIPE.yaml``, to a checkpoint of ours).

CHECKPOINT is one of our checkpoints (a checkpoint folder or a save_folder), a checkpoint written by llm-foundry
(Composer: a ``*.pt`` file or a sharded folder) or a Hugging Face folder, local or ``s3://``; the exported folder loads with ``transformers.AutoModelForCausalLM.from_pretrained`` and no
``trust_remote_code`` (see llmfoundry.models.hf_export for which transformers class each architecture maps to).

OUT_DIR is a local folder or ``s3://bucket/prefix``: a remote export is written to a local staging folder and
uploaded with ``config.json`` and a ``.complete`` marker last (llmfoundry.train.uploads.publish_folder), so a
reader never takes a partial upload for a model. ``--hf_repo_for_upload`` (llm-foundry's convert_composer_to_hf
flag) then uploads the folder to a Hugging Face Hub repo, created private if missing; ``--test_uploaded_model``
loads it back from there and compares it with the export. Whether the Hub can be reached is checked before the
model is loaded, so an offline machine fails at once.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HFValidationError, LocalTokenNotFoundError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.core.precision import DTYPES
from llmfoundry.loading import load_model
from llmfoundry.models.hf_export import export_hf
from llmfoundry.commands import train
from llmfoundry.train import uploads

FILE_URL = "file://"  # an --hf_repo_for_upload that is a local folder: a Hub stand-in that needs no network
UPLOAD_TIMEOUT_S = 3600.0  # how long an s3:// OUT_DIR upload keeps retrying (as checkpoint_upload.timeout_s)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry convert", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint folder of ours or a Hugging Face folder, local or s3://")
    parser.add_argument("out_dir", help="where to write the transformers-native folder: a local folder or s3://")
    # the short names only (llmfoundry.core.precision.DTYPES also knows float32, bfloat16 and float16)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--hf_repo_for_upload", metavar="REPO", default=None,
                        help="also upload the folder to this Hugging Face Hub repo (created private if missing), "
                             f"or to a local folder given as a {FILE_URL} URL")
    parser.add_argument("--test_uploaded_model", action="store_true",
                        help="load the uploaded model back from --hf_repo_for_upload and compare it with the export")
    parser.add_argument("--recipe", metavar="RECIPE.yaml", default=None,
                        help="write a checkpoint of this project instead (a DCP folder in OUT_DIR, resumable with "
                             "load_path or autoresume): the training recipe the checkpoint continues with builds the "
                             "model and optimizer, which take the weights, optimizer state, time and data position "
                             "of CHECKPOINT (a Composer checkpoint, say)")
    args = parser.parse_args(argv)
    if args.recipe is not None:
        return write_training_checkpoint(args.checkpoint, args.out_dir, args.recipe)
    check_outputs(args.out_dir, args.hf_repo_for_upload, args.test_uploaded_model)  # before the slow part
    model, tokenizer = load_model(args.checkpoint, use=None)  # an hf_t5 checkpoint exports too
    write_outputs(model, tokenizer, args.out_dir, args.dtype, args.hf_repo_for_upload, args.test_uploaded_model)
    return 0


def write_training_checkpoint(checkpoint: str, out_dir: str, recipe: str) -> int:
    """``llmfoundry train RECIPE load_path=CHECKPOINT save_folder=OUT_DIR only_composer_checkpoint=true``: the
    recipe's model and optimizer restored from CHECKPOINT, saved as one checkpoint of ours, without training."""
    overrides = [f"load_path={checkpoint}", f"save_folder={out_dir}", "only_composer_checkpoint=true",
                 "autoresume=false", "load_weights_only=false"]
    return train.main([recipe, *overrides])


# ----------------------------------------------------------------------------------------------- checks up front
def check_outputs(out_dir: str, repo: str | None, test_uploaded: bool) -> None:
    """One-line errors for destinations that cannot be written, raised before any model is loaded."""
    if objectstore.is_remote(out_dir):
        try:
            objectstore.ObjectFolder(out_dir, "OUT_DIR", max_attempts=3).probe()
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


# ----------------------------------------------------------------------------------------------- writing
def write_outputs(model, tokenizer, out_dir: str, dtype: str, repo: str | None = None,
                  test_uploaded: bool = False) -> str:
    """Export ``model`` to ``out_dir`` (local or s3://), then upload it to ``repo`` when given; returns the
    transformers class name. The one place convert's outputs are written, whatever the input was."""
    with local_folder(out_dir) as folder:
        name = export_hf(model, tokenizer, folder, dtype)
        if objectstore.is_remote(out_dir):
            retry = objectstore.Retry(time.monotonic() + UPLOAD_TIMEOUT_S)
            uploads.publish_folder(folder, out_dir, retry, last=("config.json",))
        if objectstore.is_remote(out_dir):
            print(f"wrote {name} ({dtype}) to {out_dir}; llmfoundry generate/eval read it in place, transformers "
                  "once it is downloaded")
        else:
            print(f"wrote {name} ({dtype}) to {out_dir}; load it with "
                  f"transformers.{auto_class(folder).__name__}.from_pretrained('{out_dir}')")  # fmt: skip
        if repo is not None:
            where = upload_model(folder, repo)
            print(f"uploaded {out_dir} to {where}")
            if test_uploaded:
                check_uploaded_model(folder, where, dtype)
                print(f"--test_uploaded_model: the model loaded from {where} matches the export")
    return name


@contextmanager
def local_folder(out_dir: str) -> Iterator[Path]:
    """``out_dir`` itself when local; for a URL, a fresh staging folder, removed once the uploads are done (kept
    after a failure, so the export can be uploaded by hand)."""
    if not objectstore.is_remote(out_dir):
        yield Path(out_dir)
        return
    staged = objectstore.staging_root(out_dir) / "convert"
    shutil.rmtree(staged, ignore_errors=True)
    yield staged
    shutil.rmtree(staged, ignore_errors=True)


def upload_model(folder: Path, destination: str) -> str:
    """Upload the exported ``folder`` to ``destination`` and return where it went: a Hugging Face Hub repo id
    (created private if missing, as llm-foundry's convert_composer_to_hf does) or a ``file://`` URL of a local
    folder, which stands in for the Hub where there is no network (tests, air-gapped mirrors)."""
    if destination.startswith(FILE_URL):
        target = Path(destination[len(FILE_URL):])
        shutil.copytree(folder, target, dirs_exist_ok=True)
        return str(target)
    api = HfApi()
    api.create_repo(destination, repo_type="model", private=True, exist_ok=True)
    api.upload_folder(repo_id=destination, folder_path=str(folder), repo_type="model")
    return destination


def auto_class(folder: Path):
    """transformers' Auto class that loads the exported ``folder``: Seq2SeqLM for an encoder-decoder (hf_t5)."""
    encoder_decoder = getattr(AutoConfig.from_pretrained(str(folder)), "is_encoder_decoder", False)
    return AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM


def check_uploaded_model(folder: Path, uploaded: str, dtype: str) -> None:
    """Load the model back from where :func:`upload_model` put it and check that it is the export: same class,
    dtype and weights (llm-foundry's check compares classes, parameter counts and dtype)."""
    expected = auto_class(folder).from_pretrained(str(folder), dtype=DTYPES[dtype])
    got = auto_class(folder).from_pretrained(uploaded, dtype=DTYPES[dtype])
    theirs, ours = got.state_dict(), expected.state_dict()
    same = type(got) is type(expected) and theirs.keys() == ours.keys() and all(
        theirs[k].dtype == ours[k].dtype and torch.equal(theirs[k], ours[k]) for k in ours)
    if not same:
        raise ConfigError(f"--test_uploaded_model: the model loaded from {uploaded} differs from the export in "
                          f"{folder} (re-run the upload)")
