"""The models of an eval recipe: ``models[].model`` validated and built exactly as a training recipe's ``model:``
section, from local or ``s3://`` paths.

An entry of ``models`` is one of:

* ``load_path``: one of our training checkpoints (a checkpoint folder or a save_folder, whose newest complete
  checkpoint is used) or a Hugging Face folder, local or ``s3://``. A remote one is downloaded first (into the
  same staging folder the trainer uses for ``load_path: s3://...``; a Hugging Face folder on S3 is recognised by
  its ``config.json``). With a ``model`` section too, a training checkpoint's weights go into the model that
  section builds (llm-foundry's ``load_path``); without one, the checkpoint's own config.yaml rebuilds its model.
  A Hugging Face ``load_path`` is the ``pretrained_model_name_or_path`` of an ``hf_causal_lm`` section.
* ``model``: ``{name: hf_causal_lm, pretrained_model_name_or_path: ..., config_overrides: ..., ...}`` or any
  registered model (``mpt_causal_lm``, ...) with its settings (``name`` defaults to ``hf_causal_lm``). Every key is
  checked against the settings the model registered and handed to the same builder the trainer calls, so
  ``pretrained: false``, ``config_overrides``, ``attn_implementation``, ``peft_config``, ... all take effect and a
  misspelt key is an error.

The tokenizer is ``tokenizer: {name, kwargs}`` when given (built like the trainer's, ``model_max_length``
defaulting to ``max_seq_len``), else the Hugging Face folder's or the checkpoint's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from llmfoundry.config.errors import ConfigError
from llmfoundry.train.checkpoint import stage_model_path
from llmfoundry.train.remote import is_remote

HF = "hf_causal_lm"


def is_hf_folder(path: str) -> bool:
    return (Path(path) / "config.json").is_file()


# ----------------------------------------------------------------------------------------------- settings
def model_settings(spec, key: str, pretrained_path: str | None = None) -> tuple[str, Any]:
    """``(name, settings)`` of ``spec.model`` validated against the settings class its builder registered.

    ``pretrained_path``: a Hugging Face folder (``load_path``) that an ``hf_causal_lm`` section loads from; a
    section naming another ``pretrained_model_name_or_path`` as well is an error."""
    from llmfoundry import registry
    from llmfoundry.config.validate import validate

    raw = dict(spec.model or {})
    name = raw.pop("name", HF)
    entry = registry.models.get(name, key=f"{key}.model.name")
    if name == HF and pretrained_path is not None:
        given = raw.get("pretrained_model_name_or_path")
        if given not in (None, spec.load_path, pretrained_path):
            raise ConfigError(f"{key}.model.pretrained_model_name_or_path: give either it or load_path "
                              f"('{given}' and '{spec.load_path}')")
        raw["pretrained_model_name_or_path"] = pretrained_path
    if entry.config is None:
        return name, raw
    return name, validate(raw, entry.config, f"{key}.model")


def check_models(models: list) -> None:
    """Config-time checks of every ``models`` entry (unknown model names and keys, missing paths), all at once."""
    problems: list[str] = []
    names = [m.model_name for m in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"models: model_name must be unique (it keys the results); repeated: {', '.join(repeated)}")
    for i, spec in enumerate(models):
        key = f"models[{i}]"
        if not spec.model and not spec.load_path:
            problems.append(f"{key}: give load_path (a checkpoint or Hugging Face folder) or a model section")
            continue
        if spec.model:
            try:
                # a load_path may stand in for hf_causal_lm's pretrained_model_name_or_path
                model_settings(spec, key, pretrained_path=spec.load_path)
            except ConfigError as error:
                problems.extend(error.problems)
    if problems:
        raise ConfigError.many(problems)


# ----------------------------------------------------------------------------------------------- building
def build_tokenizer(spec, key: str, default: str | None, max_seq_len: int | None):
    """The entry's tokenizer section, else the tokenizer in folder ``default``, built like the trainer's."""
    from llmfoundry.data.tokenizers import build_tokenizer as build

    section = spec.tokenizer
    name = section.name if section is not None and section.name else default
    if name is None:
        raise ConfigError(f"{key}.tokenizer.name: give the tokenizer (a folder or hub id)")
    kwargs = dict(section.kwargs) if section is not None else {}
    if max_seq_len is not None:
        kwargs.setdefault("model_max_length", max_seq_len)
    try:
        return build(name, kwargs)
    except ConfigError as error:
        raise error.rekeyed("tokenizer", f"{key}.tokenizer") from None


def _build(name: str, settings: Any, tokenizer, key: str) -> torch.nn.Module:
    from llmfoundry import registry

    entry = registry.models.get(name, key=f"{key}.model.name")
    try:
        return entry.builder(settings, tokenizer)
    except ConfigError as error:
        raise error.rekeyed("model", f"{key}.model") from None


def load_model(spec, device: torch.device | str = "cpu", *, max_seq_len: int | None = None,
               precision: str = "fp32", key: str | None = None):
    """``(model, tokenizer)`` for one entry of ``models``, on ``device``, in eval mode; weights in fp32 (bf16 for
    ``precision: bf16``). A transformers model comes back unwrapped (no hf_causal_lm wrapper)."""
    from llmfoundry.train.checkpoint import load_checkpoint, load_model_for_inference, resolve_checkpoint

    key = key or f"models.{spec.model_name}"
    local = stage_model_path(spec.load_path, f"{key}.load_path") if spec.load_path else None
    if local is not None and not is_hf_folder(local):  # one of our training checkpoints
        if not spec.model:
            model, tokenizer = load_model_for_inference(local, device="cpu")
            if spec.tokenizer is not None and spec.tokenizer.name:
                tokenizer = build_tokenizer(spec, key, None, max_seq_len)
        else:
            folder = resolve_checkpoint(local, key=f"{key}.load_path")
            own = folder / "tokenizer"
            tokenizer = build_tokenizer(spec, key, str(own) if own.is_dir() else None, max_seq_len)
            name, settings = model_settings(spec, key)
            model = _build(name, settings, tokenizer, key)
            load_checkpoint(folder, model=model, optimizer=None, weights_only=True)
    else:
        name, settings = model_settings(spec, key, pretrained_path=local)
        source = getattr(settings, "pretrained_model_name_or_path", None)
        if is_remote(source):
            settings.pretrained_model_name_or_path = source = stage_model_path(
                source, f"{key}.model.pretrained_model_name_or_path")
        default = source if isinstance(source, str) and (name == HF or is_hf_folder(source)) else None
        tokenizer = build_tokenizer(spec, key, default, max_seq_len)
        model = _build(name, settings, tokenizer, key)
    model = getattr(model, "hf_model", model)  # call the transformers model itself (KV cache, generate)
    model = model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    return model.to(device).eval(), tokenizer
