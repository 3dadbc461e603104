"""The one way from a path to ``(model, tokenizer)``, shared by eval, convert, generate, chat and the lm-eval adapter.

A model path is one of

* one of our training checkpoints: a checkpoint folder (``ep0-ba100/``) or a save_folder (its ``latest`` is used);
  the checkpoint's own ``config.yaml`` rebuilds the model through the trainer's builders and its ``tokenizer/``
  folder is the tokenizer;
* a Hugging Face folder (recognised by its ``config.json``): our own MPT folders and any transformers model;
* a checkpoint written by llm-foundry (Composer): a ``*.pt`` file or a sharded folder; it is written out as the
  Hugging Face folder llm-foundry's convert_composer_to_hf.py would write (train.composer_checkpoint), then read
  as one;

and may be local or in an object store (``s3://...``), in which case it is downloaded into the trainer's staging
folder first (``train.checkpointer.stage_model_path``). ``load_eval_model`` builds one entry of an eval recipe's ``models`` list,
whose ``model`` section is validated and built exactly as a training recipe's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from llmfoundry import registry
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.tokenizers import build_tokenizer, load_saved_tokenizer
from llmfoundry.eval.models import HF, model_settings
from llmfoundry.models.hf import load_hf_causal_lm
from llmfoundry.models.hf_import import is_llm_foundry_mpt_folder, load_as_mpt
from llmfoundry.models.interface import is_encoder_decoder
from llmfoundry.models.settings import HFModelSettings
from llmfoundry.train import composer_checkpoint, parallel
from llmfoundry.train.builders import build_model
from llmfoundry.train.builders import build_tokenizer as build_recipe_tokenizer
from llmfoundry.train.checkpoint import load_checkpoint, read_checkpoint_config, resolve_checkpoint
from llmfoundry.train.checkpointer import stage_model_path
from llmfoundry.train.components import weights_of
from llmfoundry.train.recipe import TrainConfig, validate


def is_hf_folder(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


def local_model_path(path: str | Path, key: str = "model") -> Path:
    """A local path for a model path: downloaded first when remote; a Composer checkpoint is written out as a
    Hugging Face folder in the staging area."""
    path = Path(stage_model_path(str(path), key))
    found = composer_checkpoint.find_composer_checkpoint(path)
    if found is None:
        return path
    folder = objectstore.staging_root(str(found.resolve())) / "huggingface"
    return composer_checkpoint.write_hf_folder(composer_checkpoint.read_composer_checkpoint(found, key), folder, key)


def load_checkpoint_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model, tokenizer) from one of our checkpoints, rebuilt from its config.yaml, on ``device`` in eval mode."""
    path = resolve_checkpoint(path, key="checkpoint")
    cfg = validate(read_checkpoint_config(path), TrainConfig)
    tokenizer_dir = path / "tokenizer"
    if tokenizer_dir.is_dir():
        tokenizer = load_saved_tokenizer(tokenizer_dir)
    else:
        tokenizer = build_recipe_tokenizer(cfg.tokenizer, cfg.max_seq_len)
    model = build_model(cfg.model, tokenizer)
    if parallel.is_meta(model):  # trained with init_device: meta: storage for the weights the checkpoint fills in
        parallel.allocate_meta(model, "cpu")
    load_checkpoint(path, weights_of(model), weights_only=True)
    return model.to(device).eval(), tokenizer


def refuse_encoder_decoder(model: torch.nn.Module, key: str, use: str) -> None:
    """A one-line error when ``model`` is an encoder-decoder model (hf_t5): ``use`` (ICL evaluation, generation)
    takes decoder-only models here."""
    if is_encoder_decoder(model):
        raise ConfigError(f"{key}: an encoder-decoder model (hf_t5) cannot be used for {use} here, which takes "
                          "decoder-only models (llmfoundry convert exports it; transformers' T5 classes run it)")


def load_model(path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype | None = None,
               key: str = "model", use: str | None = "generation"):
    """(model, tokenizer) from one of our checkpoints or a Hugging Face folder (local or ``s3://``), in eval mode.

    ``dtype``: the weights' dtype for a Hugging Face folder (default: transformers' choice); a checkpoint of ours
    comes back in the dtype its recipe trains in. ``use``: what the model is for, when only decoder-only models
    can do it (an hf_t5 checkpoint is a one-line error); None (convert) takes encoder-decoder models too."""
    path = local_model_path(path, key)
    if not is_hf_folder(path):
        model, tokenizer = load_checkpoint_model(path, device)
        if use is not None:
            refuse_encoder_decoder(model, key, use)
        return model, tokenizer
    if is_llm_foundry_mpt_folder(path):  # read as JSON and tensors: its Python files are never run
        model = load_as_mpt(path)
        return model.to(dtype or torch.float32).to(device).eval(), load_saved_tokenizer(path)
    # The loader of a recipe's hf_causal_lm section (and of an eval recipe's Hugging Face models): any
    # transformers model, and our own MPT folders, which llmfoundry.models registers with the Auto classes.
    try:
        model = load_hf_causal_lm(HFModelSettings(pretrained_model_name_or_path=str(path))).hf_model
    except ConfigError as error:
        raise error.rekeyed("model.pretrained_model_name_or_path", key) from None
    if dtype is not None:
        model = model.to(dtype)
    return model.to(device).eval(), load_saved_tokenizer(path)


# ----------------------------------------------------------------------------------------------- eval recipes
def _eval_tokenizer(spec, key: str, default: str | None, max_seq_len: int | None):
    """The entry's tokenizer section, else the tokenizer in folder ``default``, built like the trainer's."""
    section = spec.tokenizer
    name = section.name if section is not None and section.name else default
    if name is None:
        raise ConfigError(f"{key}.tokenizer.name: give the tokenizer (a folder or hub id)")
    kwargs = dict(section.kwargs) if section is not None else {}
    if max_seq_len is not None:
        kwargs.setdefault("model_max_length", max_seq_len)
    try:
        return build_tokenizer(name, kwargs)
    except ConfigError as error:
        raise error.rekeyed("tokenizer", f"{key}.tokenizer") from None


def _build(name: str, settings: Any, tokenizer, key: str) -> torch.nn.Module:
    entry = registry.models.get(name, key=f"{key}.model.name")
    try:
        return entry.builder(settings, tokenizer)
    except ConfigError as error:
        raise error.rekeyed("model", f"{key}.model") from None


def load_eval_model(spec, device: torch.device | str = "cpu", *, max_seq_len: int | None = None,
                    precision: str = "fp32", key: str | None = None):
    """``(model, tokenizer)`` for one entry of an eval recipe's ``models``, on ``device``, in eval mode; weights in
    fp32 (bf16 for ``precision: bf16``). A transformers model comes back unwrapped (no hf_causal_lm wrapper).

    ``load_path`` alone: a checkpoint of ours rebuilds its own model; a Hugging Face folder is the
    ``pretrained_model_name_or_path`` of an ``hf_causal_lm`` section. ``load_path`` and ``model`` together: a
    checkpoint's weights go into the model the section builds (llm-foundry's ``load_path``)."""
    key = key or f"models.{spec.model_name}"
    local = str(local_model_path(spec.load_path, f"{key}.load_path")) if spec.load_path else None
    if local is not None and not is_hf_folder(local):  # one of our training checkpoints
        if not spec.model:
            model, tokenizer = load_checkpoint_model(local, device="cpu")
            if spec.tokenizer is not None and spec.tokenizer.name:
                tokenizer = _eval_tokenizer(spec, key, None, max_seq_len)
        else:
            folder = resolve_checkpoint(local, key=f"{key}.load_path")
            own = folder / "tokenizer"
            tokenizer = _eval_tokenizer(spec, key, str(own) if own.is_dir() else None, max_seq_len)
            name, settings = model_settings(spec, key)
            model = _build(name, settings, tokenizer, key)
            if parallel.is_meta(model):  # init_device: meta: storage for the weights the checkpoint fills in
                parallel.allocate_meta(model, "cpu")
            load_checkpoint(folder, weights_of(model), weights_only=True)
    else:
        name, settings = model_settings(spec, key, pretrained_path=local)
        source = getattr(settings, "pretrained_model_name_or_path", None)
        if objectstore.is_remote(source):
            settings.pretrained_model_name_or_path = source = stage_model_path(
                source, f"{key}.model.pretrained_model_name_or_path")
        default = source if isinstance(source, str) and (name == HF or is_hf_folder(source)) else None
        tokenizer = _eval_tokenizer(spec, key, default, max_seq_len)
        model = _build(name, settings, tokenizer, key)
    refuse_encoder_decoder(model, key, "evaluation")
    if parallel.is_meta(model):  # init_device: meta with no weights to load: initialise it here, on the CPU
        parallel.materialize(model, "cpu", torch.initial_seed())
    model = getattr(model, "hf_model", model)  # call the transformers model itself (KV cache, generate)
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    return model.to(device).eval(), tokenizer
