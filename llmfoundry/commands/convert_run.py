"""``llmfoundry convert`` once its flags and destinations are checked (commands/convert.py, which documents it):
the model loaded, exported to a transformers-native folder, uploaded and, if asked, loaded back and compared."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub import HfApi
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from llmfoundry.commands.convert_checks import FILE_URL
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.precision import DTYPES
from llmfoundry.loading import load_model
from llmfoundry.models.hf_export import export_hf
from llmfoundry.train import uploads

UPLOAD_TIMEOUT_S = 3600.0  # how long an s3:// OUT_DIR upload keeps retrying (as checkpoint_upload.timeout_s)


def convert_model(checkpoint: str, out_dir: str, dtype: str, repo: str | None, test_uploaded: bool) -> str:
    """``checkpoint`` (any model path llmfoundry.loading reads; an hf_t5 checkpoint too) exported to ``out_dir``;
    returns the transformers class name."""
    model, tokenizer = load_model(checkpoint, use=None)
    return write_outputs(model, tokenizer, out_dir, dtype, repo, test_uploaded)


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
