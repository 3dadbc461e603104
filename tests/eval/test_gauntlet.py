"""Gauntlet arithmetic and tables."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import yaml

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import load_gauntlet, load_icl_tasks
from llmfoundry.eval.gauntlet import compute_gauntlet, gauntlet_table, markdown_table, tasks_table

GAUNTLET = {
    "weighting": "EQUAL",
    "subtract_random_baseline": True,
    "rescale_accuracy": True,
    "categories": [
        {"name": "knowledge", "benchmarks": [
            {"name": "arc", "num_fewshot": 3, "random_baseline": 0.25},
            {"name": "trivia", "num_fewshot": 0, "random_baseline": 0.0},
        ]},
        {"name": "reading", "benchmarks": [{"name": "boolq", "num_fewshot": 0, "random_baseline": 0.5}]},
        {"name": "missing_one", "benchmarks": [
            {"name": "arc", "num_fewshot": 3, "random_baseline": 0.25},
            {"name": "absent", "num_fewshot": 0, "random_baseline": 0.0},
        ]},
    ],
    "averages": {"core": ["knowledge", "reading"], "with_missing": ["knowledge", "missing_one"]},
}
METRICS = {"icl/arc/3-shot/accuracy": 0.55, "icl/trivia/0-shot/accuracy": 0.2, "icl/boolq/0-shot/accuracy": 0.7,
           "icl/arc/3-shot/acc": 0.45}
COUNTS = {"arc/3-shot": 1000, "trivia/0-shot": 10, "boolq/0-shot": 100}


def test_equal_weighting_subtracts_and_rescales_the_random_baseline(caplog):
    with caplog.at_level(logging.WARNING):
        out = compute_gauntlet(METRICS, GAUNTLET)
    arc = (0.55 - 0.25) / 0.75  # 0.4
    assert out["icl/gauntlet/knowledge"] == pytest.approx((arc + 0.2) / 2)
    assert out["icl/gauntlet/reading"] == pytest.approx((0.7 - 0.5) / 0.5)
    assert "icl/gauntlet/missing_one" not in out  # left out with a warning
    assert "absent/0-shot" in caplog.text
    assert out["icl/gauntlet/core"] == pytest.approx(((arc + 0.2) / 2 + 0.4) / 2)
    assert out["icl/gauntlet/with_missing"] == pytest.approx((arc + 0.2) / 2)  # over the categories present


def test_sample_size_weightings():
    arc = (0.55 - 0.25) / 0.75
    out = compute_gauntlet(METRICS, {**GAUNTLET, "weighting": "SAMPLE_SZ"}, COUNTS)
    assert out["icl/gauntlet/knowledge"] == pytest.approx((arc * 1000 + 0.2 * 10) / 1010)
    out = compute_gauntlet(METRICS, {**GAUNTLET, "weighting": "LOG_SAMPLE_SZ"}, COUNTS)
    w_arc, w_trivia = math.log2(1000), math.log2(10)
    assert out["icl/gauntlet/knowledge"] == pytest.approx((arc * w_arc + 0.2 * w_trivia) / (w_arc + w_trivia))


def test_baseline_switches_and_metric_choice():
    raw = compute_gauntlet(METRICS, {**GAUNTLET, "subtract_random_baseline": False, "rescale_accuracy": False})
    assert raw["icl/gauntlet/reading"] == pytest.approx(0.7)
    sub = compute_gauntlet(METRICS, {**GAUNTLET, "rescale_accuracy": False})
    assert sub["icl/gauntlet/reading"] == pytest.approx(0.2)
    acc = compute_gauntlet({**METRICS, "icl/trivia/0-shot/acc": 0.1}, {**GAUNTLET, "metric": "acc"})
    assert acc["icl/gauntlet/knowledge"] == pytest.approx(((0.45 - 0.25) / 0.75 + 0.1) / 2)


def test_gauntlet_loads_from_a_yaml_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"eval_gauntlet": GAUNTLET}))
    cfg = load_gauntlet(str(path))
    assert cfg.categories[0].benchmarks[0].random_baseline == 0.25
    assert compute_gauntlet(METRICS, str(path)) == compute_gauntlet(METRICS, GAUNTLET)


def test_shipped_v03_gauntlet_and_task_list_are_consistent():
    root = Path(__file__).resolve().parents[2] / "eval" / "yamls"
    cfg = load_gauntlet(str(root / "eval_gauntlet_v0.3.yaml"))
    tasks = {(t.label, n) for t in load_icl_tasks(str(root / "tasks_v0.3.yaml")) for n in t.num_fewshot}
    for category in cfg.categories:
        for bench in category.benchmarks:
            assert (bench.name, bench.num_fewshot) in tasks, bench


def test_tables_render_as_markdown():
    table = tasks_table(METRICS | {"icl/jeop/0-shot/science/accuracy": 0.5, "icl/jeop/0-shot/accuracy": 0.5})
    lines = table.splitlines()
    assert lines[0] == "| task | shots | category | accuracy | acc |"
    assert "| arc | 3 |  | 0.5500 | 0.4500 |" in lines
    assert "| jeop | 0 | science | 0.5000 |  |" in lines
    g = gauntlet_table({"m1": compute_gauntlet(METRICS, GAUNTLET), "m2": {}})
    assert g.splitlines()[0] == "| category | m1 | m2 |"
    assert markdown_table([{"a": 1}], ["a"]) == "| a |\n|:---|\n| 1 |"


def test_without_averages_there_is_llm_foundrys_default_average():
    no_avg = {k: v for k, v in GAUNTLET.items() if k != "averages"}
    out = compute_gauntlet(METRICS, no_avg)
    arc = (0.55 - 0.25) / 0.75
    knowledge, reading = (arc + 0.2) / 2, 0.4
    # over every category that has a score (missing_one is left out)
    assert out["icl/gauntlet/default_average"] == pytest.approx((knowledge + reading) / 2)
    assert compute_gauntlet(METRICS, {**no_avg, "averages": {}}) == {  # an explicit empty mapping: no average
        "icl/gauntlet/knowledge": pytest.approx(knowledge), "icl/gauntlet/reading": pytest.approx(reading)}


def test_an_average_whose_categories_are_all_missing_is_zero():
    out = compute_gauntlet(METRICS, {**GAUNTLET, "averages": {"gone": ["missing_one"]}})
    assert out["icl/gauntlet/gone"] == 0.0  # llm-foundry reports 0
    assert compute_gauntlet({}, GAUNTLET) == {}  # nothing evaluated: no gauntlet at all


@pytest.mark.parametrize("change, message", [
    ({"averages": {"reading": ["knowledge"]}}, "averages.reading: 'reading' is also a category name"),
    ({"averages": {"core": ["knowldge"]}}, "averages.core: 'knowldge' is not a category of the gauntlet (did you "
                                           "mean 'knowledge'?)"),
    ({"subtract_random_baseline": False}, "rescale_accuracy: needs subtract_random_baseline: true"),
    ({"categories": [{"name": "r", "benchmarks": [{"name": "boolq", "num_fewshot": 0, "random_baseline": 1.0}]}],
      "averages": None}, "eval_gauntlet.categories[0].benchmarks[0].random_baseline: must be at least 0 and below 1"),
    ({"categories": [{"name": "r", "benchmarks": [{"name": "boolq", "num_fewshot": 0, "random_baseline": -0.1}]}],
      "averages": None}, "random_baseline: must be at least 0 and below 1"),
])  # fmt: skip
def test_bad_gauntlets_are_one_line_config_errors(change, message):
    with pytest.raises(ConfigError) as error:
        compute_gauntlet(METRICS, {**GAUNTLET, **change})
    assert message in str(error.value) and "\n" not in str(error.value)
