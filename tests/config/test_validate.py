"""Validation against typed dataclasses: every kind of error, all reported together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest

from llmfoundry.config.fields import option
from llmfoundry.config.validate import Check, Component, Registered, RegisteredMap, validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.timeunits import check_time
from llmfoundry.registry import Registry

widgets = Registry("widgets")


@dataclass
class Inner:
    alibi: bool = option(False, "use ALiBi")
    impl: Literal["torch", "sdpa"] = option("sdpa", "kernel")


@dataclass
class WidgetSettings:
    width: int = option(8, "width")
    inner: Inner = option(default_factory=Inner, doc="nested")


@widgets.register("square", config=WidgetSettings)
def build_square(settings):
    return settings


@dataclass
class Recipe:
    n_layers: int = option(doc="required")
    lr: float = option(1e-3, "learning rate")
    name: str | None = option(None, "optional name")
    tags: list[str] = option(default_factory=list, doc="tags")
    duration: Annotated[str | int, Check(check_time)] = option("1ep", "time")
    widget: Annotated[Component, Registered(widgets)] | None = option(None, "a registered widget")
    extras: Annotated[dict, RegisteredMap(widgets)] = option(default_factory=dict, doc="named widgets")
    future: int = option(0, "later", unsupported="the future feature")


def problems_of(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(data, Recipe)
    return info.value.problems


def test_valid_config_converts_types_and_builds_components():
    cfg = validate({"n_layers": 2, "lr": 1, "widget": {"name": "square", "width": 3, "inner": {"alibi": True}},
                    "extras": {"square": {}}}, Recipe)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.widget.name == "square"
    assert cfg.widget.settings.width == 3 and cfg.widget.settings.inner.alibi is True
    assert cfg.extras["square"].width == 8


def test_unknown_key_names_it_and_suggests_the_closest():
    (problem,) = problems_of({"n_layers": 2, "n_layer": 3})
    assert problem == "n_layer: unknown key (did you mean 'n_layers'?)"


def test_unknown_nested_key_has_its_full_path():
    (problem,) = problems_of({"n_layers": 2, "widget": {"name": "square", "inner": {"albi": True}}})
    assert problem == "widget.inner.albi: unknown key (did you mean 'widget.inner.alibi'?)"


def test_wrong_type_names_key_and_expected_type():
    (problem,) = problems_of({"n_layers": "two"})
    assert problem == "n_layers: expected an int, got 'two'"


def test_bool_is_not_accepted_as_int():
    (problem,) = problems_of({"n_layers": True})
    assert "expected an int" in problem


def test_missing_required_key():
    (problem,) = problems_of({})
    assert problem.startswith("n_layers: required key is missing")


def test_literal_lists_the_choices():
    (problem,) = problems_of({"n_layers": 1, "widget": {"name": "square", "inner": {"impl": "flsh"}}})
    assert problem == "widget.inner.impl: 'flsh' is not one of 'torch', 'sdpa'"


def test_unknown_registered_name_lists_valid_names():
    (problem,) = problems_of({"n_layers": 1, "widget": {"name": "sqare"}})
    assert "widget.name: unknown widgets 'sqare' (did you mean 'square'?); valid names: square" == problem


def test_bad_time_string_is_explained():
    (problem,) = problems_of({"n_layers": 1, "duration": "10 batches"})
    assert problem.startswith("duration: '10 batches' is not a time")


def test_unsupported_key_set_to_a_non_default_value_is_an_error():
    (problem,) = problems_of({"n_layers": 1, "future": 3})
    assert problem == "future: the future feature is not supported yet (remove the key or keep its default)"
    assert validate({"n_layers": 1, "future": 0}, Recipe).future == 0


def test_all_problems_are_reported_together():
    problems = problems_of({"n_layer": 1, "lr": "x", "tags": "a", "widget": {"name": "square", "width": 1.5}})
    assert len(problems) == 5  # unknown n_layer, missing n_layers, lr type, tags type, width type
    with pytest.raises(ConfigError) as info:
        validate({"n_layer": 1, "lr": "x"}, Recipe)
    assert str(info.value).startswith("3 problems in the config:")
