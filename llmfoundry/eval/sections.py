"""Evaluation keys shared by the training recipe and the eval recipe, finished after validation:

* ``icl_tasks_str`` / ``eval_gauntlet_str``: llm-foundry's internal names of ``icl_tasks`` / ``eval_gauntlet``
  given as a YAML file path; moved to those keys (setting both is an error, as in llm-foundry).
* ``eval_loader`` given a list: read as ``eval_loaders``, as llm-foundry does.
* ``eval_loaders``: each entry validated as a loader section plus its ``label`` (see :class:`EvalLoaderSpec`).

Metrics of the loaders are logged under Composer's evaluator labels (:func:`eval_metric_prefix`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from llmfoundry import registry
from llmfoundry.config.validate import Component, Registered, validate
from llmfoundry.core.errors import ConfigError


@dataclass
class EvalLoaderSpec:
    """One entry of ``eval_loaders``: its label and its validated loader section."""

    label: str
    loader: Component


def finish_eval_sections(cfg: Any, prefix: str) -> list[str]:
    """Map the keys above onto the recipe's own (in place) and return the problems found."""
    problems: list[str] = []
    for alias, key in (("icl_tasks_str", "icl_tasks"), ("eval_gauntlet_str", "eval_gauntlet")):
        value = getattr(cfg, alias)
        if value is None:
            continue
        if getattr(cfg, key) is not None:
            problems.append(f"{prefix}{alias}: set only one of {key} and {alias} ({alias} is llm-foundry's name for "
                            f"{key} given as a YAML file path)")
        else:
            setattr(cfg, key, value)
            setattr(cfg, alias, None)
    if isinstance(cfg.eval_loader, list):  # llm-foundry reads a list under eval_loader as eval_loaders
        if cfg.eval_loaders is not None:
            problems.append(f"{prefix}eval_loader: a list of loaders is eval_loaders, which is set too (keep one)")
        cfg.eval_loaders, cfg.eval_loader = cfg.eval_loader, None
    if cfg.eval_loaders is not None:
        if cfg.eval_loader is not None:
            problems.append(f"{prefix}eval_loaders: set only one of eval_loader and eval_loaders (as in llm-foundry)")
        else:
            specs = _eval_loader_specs(cfg.eval_loaders, f"{prefix}eval_loaders", problems)
            if specs is not None:
                cfg.eval_loaders = specs
    return problems


def _eval_loader_specs(entries: list[dict[str, Any]], path: str, problems: list[str]) -> list[EvalLoaderSpec] | None:
    specs, labels = [], set()
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        if isinstance(entry, EvalLoaderSpec):  # already finished (a recipe validated twice)
            specs.append(entry)
            continue
        label = entry.get("label")
        if not isinstance(label, str) or not label:
            problems.append(f"{where}.label: required (each loader of eval_loaders is logged under its label)")
            continue
        if label in labels:
            problems.append(f"{where}.label: '{label}' is used twice (labels name the metrics; make them unique)")
        labels.add(label)
        try:
            loader = validate({k: v for k, v in entry.items() if k != "label"},
                              Annotated[Component, Registered(registry.dataloaders)], where)
        except ConfigError as error:
            problems.extend(error.problems)
            continue
        specs.append(EvalLoaderSpec(label, loader))
    return specs if len(specs) == len(entries) else None


def eval_metric_prefix(label: str | None) -> str:
    """Composer's evaluator labels as llm-foundry sets them: 'eval' for eval_loader, 'eval/<label>' for each
    entry of eval_loaders; metrics are logged as metrics/<evaluator label>/<metric name>."""
    return "metrics/eval" if label is None else f"metrics/eval/{label}"


def eval_sections(cfg: Any) -> list[tuple[str, str, Component]]:
    """(metric prefix, key for errors, loader section) of eval_loader, or of each entry of eval_loaders."""
    if cfg.eval_loader is not None:
        return [(eval_metric_prefix(None), "eval_loader", cfg.eval_loader)]
    return [(eval_metric_prefix(spec.label), f"eval_loaders[{i}]", spec.loader)
            for i, spec in enumerate(cfg.eval_loaders or [])]
