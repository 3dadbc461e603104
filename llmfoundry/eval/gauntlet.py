"""The eval gauntlet: benchmark accuracies combined into category scores and named averages, plus tables.

For each category, each benchmark's score is its accuracy (``icl/{name}/{num_fewshot}-shot/{metric}``), minus
its ``random_baseline`` when ``subtract_random_baseline``, divided by ``1 - random_baseline`` when also
``rescale_accuracy``. The category score is the weighted mean of its benchmarks' scores, with weights 1 (EQUAL),
the number of examples (SAMPLE_SZ) or ``max(log2(number of examples), 1)`` (LOG_SAMPLE_SZ). As in llm-foundry:
a category with a missing benchmark is left out (with a warning); an average is the plain mean of the categories
it names that are present, and 0 when none is; without ``averages`` there is one, ``default_average``, over all
categories.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import GauntletConfig, headline_first, load_gauntlet

log = logging.getLogger(__name__)

PREFIX = "icl/gauntlet"
DEFAULT_AVERAGE = "default_average"  # llm-foundry's name for the average when the gauntlet names none


def _weight(weighting: str, count: int | None, name: str) -> float:
    if weighting == "EQUAL":
        return 1.0
    if count is None:
        raise ConfigError(f"eval_gauntlet.weighting: {weighting} needs the number of examples of {name}")
    count = max(count, 1)
    if weighting == "SAMPLE_SZ":
        return float(count)
    return max(math.log2(count), 1.0)


def compute_gauntlet(
    metrics: dict[str, float],
    gauntlet_cfg: GauntletConfig | dict | str,
    sample_counts: dict[str, int] | None = None,
) -> dict[str, float]:
    """Category scores and averages as ``icl/gauntlet/{category}`` and ``icl/gauntlet/{average}``.

    ``metrics``: the evaluator's flat metrics. ``sample_counts``: ``{"label/{n}-shot": examples}`` (from
    ``ICLEvaluator.sample_counts()``), needed for SAMPLE_SZ / LOG_SAMPLE_SZ weighting.
    """
    cfg = load_gauntlet(gauntlet_cfg)
    assert cfg is not None
    if not any(k.startswith("icl/") and not k.startswith(PREFIX + "/") for k in metrics):
        return {}  # nothing was evaluated (llm-foundry reports no gauntlet then)
    scores: dict[str, float] = {}
    for category in cfg.categories:
        parts = []
        missing = []
        for bench in category.benchmarks:
            bench_name = f"{bench.name}/{bench.num_fewshot}-shot"
            key = f"icl/{bench_name}/{cfg.metric}"
            if key not in metrics:
                missing.append(bench_name)
                continue
            score = metrics[key]
            if cfg.subtract_random_baseline:
                score -= bench.random_baseline
                if cfg.rescale_accuracy:
                    score /= 1.0 - bench.random_baseline
            count = None if sample_counts is None else sample_counts.get(bench_name)
            parts.append((score, _weight(cfg.weighting, count, bench_name)))
        if missing:
            log.warning("gauntlet: leaving out category '%s': no results for %s", category.name, ", ".join(missing))
            continue
        if not parts:
            continue
        total = sum(w for _, w in parts)
        scores[category.name] = sum(s * w for s, w in parts) / total
    out = {f"{PREFIX}/{name}": value for name, value in scores.items()}
    averages = cfg.averages if cfg.averages is not None else {DEFAULT_AVERAGE: [c.name for c in cfg.categories]}
    for avg_name, names in averages.items():
        present = [n for n in names if n in scores]
        if len(present) < len(names):
            log.warning(
                "gauntlet: average '%s' leaves out missing categories: %s",
                avg_name,
                ", ".join(n for n in names if n not in scores),
            )
        # llm-foundry reports 0 for an average none of whose categories is present
        out[f"{PREFIX}/{avg_name}"] = sum(scores[n] for n in present) / len(present) if present else 0.0
    return out


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A GitHub markdown table of ``rows`` (dicts) with the given columns."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(":---" if i == 0 else "---:" for i in
                                                                  range(len(columns))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def tasks_table(metrics: dict[str, float], model_name: str | None = None) -> str:
    """One row per task and number of shots (and category), with a column per metric (accuracy first)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    metric_names: set[str] = set()
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) < 4 or parts[0] != "icl" or parts[1] == "gauntlet":
            continue
        label, shots, metric = parts[1], parts[2], parts[-1]
        category = "/".join(parts[3:-1])
        row = rows.setdefault((label, shots, category), {"task": label, "shots": shots.replace("-shot", ""),
                                                         "category": category})
        row[metric] = value
        metric_names.add(metric)
    columns = ["task", "shots"]
    if any(r["category"] for r in rows.values()):
        columns.append("category")
    columns += headline_first(metric_names)
    if model_name is not None:
        columns.insert(0, "model")
        for r in rows.values():
            r["model"] = model_name
    return markdown_table([rows[k] for k in sorted(rows)], columns)


def gauntlet_table(results: dict[str, dict[str, float]]) -> str:
    """Gauntlet scores of several models: one row per category/average, one column per model."""
    names: list[str] = []
    for scores in results.values():
        for key in scores:
            if key.startswith(PREFIX + "/") and key[len(PREFIX) + 1 :] not in names:
                names.append(key[len(PREFIX) + 1 :])
    rows = [{"category": n, **{m: s.get(f"{PREFIX}/{n}", "") for m, s in results.items()}} for n in names]
    return markdown_table(rows, ["category", *results])


def plot_gauntlet(results: dict[str, dict[str, float]], path: str) -> bool:
    """A grouped bar chart of gauntlet scores per model; False (and a warning) when matplotlib is missing."""
    scores = {m: {k[len(PREFIX) + 1 :]: v for k, v in s.items() if k.startswith(PREFIX + "/")}
              for m, s in results.items()}
    return plot_scores(scores, path, "gauntlet score")


def plot_task_accuracies(results: dict[str, dict[str, float]], path: str, metric: str = "accuracy") -> bool:
    """A grouped bar chart of each task's ``metric`` (``label/n-shot``) per model, for runs without a gauntlet."""
    scores = {}
    for model, metrics in results.items():
        scores[model] = {}
        for key, value in metrics.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "icl" and parts[1] != "gauntlet" and parts[3] == metric:
                scores[model][f"{parts[1]}/{parts[2]}"] = value
    return plot_scores(scores, path, metric)


def plot_scores(results: dict[str, dict[str, float]], path: str, ylabel: str) -> bool:
    """A grouped bar chart: one group per name, one bar per model. False (with a warning) when there is nothing to
    plot or matplotlib is missing."""
    names = sorted({n for scores in results.values() for n in scores})
    if not names:
        log.warning("no scores to plot; %s not written", path)
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed; no chart written to %s (pip install matplotlib)", path)
        return False
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 1.2), 4))
    width = 0.8 / max(len(results), 1)
    for i, (model, scores) in enumerate(results.items()):
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [scores.get(n, 0.0) for n in names], width=width, label=model)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
