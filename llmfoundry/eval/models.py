"""The ``models`` entries of an eval recipe, checked at validation time: each ``model`` section is validated
against the settings its registered builder declares, exactly as a training recipe's ``model:`` section.

An entry of ``models`` is one of:

* ``load_path``: one of our training checkpoints (a checkpoint folder or a save_folder, whose newest complete
  checkpoint is used) or a Hugging Face folder, local or ``s3://``. With a ``model`` section too, a training
  checkpoint's weights go into the model that section builds (llm-foundry's ``load_path``); without one, the
  checkpoint's own config.yaml rebuilds its model. A Hugging Face ``load_path`` is the
  ``pretrained_model_name_or_path`` of an ``hf_causal_lm`` section.
* ``model``: ``{name: hf_causal_lm, pretrained_model_name_or_path: ..., config_overrides: ..., ...}`` or any
  registered model (``mpt_causal_lm``, ...) with its settings (``name`` defaults to ``hf_causal_lm``).

Building the models (downloading, loading weights) is ``llmfoundry.loading.load_eval_model``.
"""

from __future__ import annotations

from typing import Any

from llmfoundry import registry
from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError

HF = "hf_causal_lm"

# ----------------------------------------------------------------------------------------------- settings
def model_settings(spec, key: str, pretrained_path: str | None = None) -> tuple[str, Any]:
    """``(name, settings)`` of ``spec.model`` validated against the settings class its builder registered.

    ``pretrained_path``: a Hugging Face folder (``load_path``) that an ``hf_causal_lm`` section loads from; a
    section naming another ``pretrained_model_name_or_path`` as well is an error."""
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
