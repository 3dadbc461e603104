"""Recipes mutated from every shipped YAML, checked by ``llmfoundry check`` (the validation ``llmfoundry train``
and ``llmfoundry eval`` run before anything else): the answer is always exit 0 or a one-line error with exit 2,
never a traceback."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import assert_clean_exit, fuzz_settings, run_cli
from tests.fuzz.strategies import corrupted_text, mutated_tree, overrides

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(REPO.glob("yamls/**/*.yaml"))
_names = itertools.count()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-recipes")


def _recipe(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _check(workdir: Path, text: str | bytes, argv_extra: list[str], what: str) -> None:
    recipe = workdir / f"recipe{next(_names)}.yaml"
    recipe.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    code, out, err = run_cli(["check", str(recipe), *argv_extra])
    assert_clean_exit(code, out, err, what)


def test_every_shipped_recipe_is_valid_as_shipped():
    """The fuzzer's seeds: each shipped recipe validates (the task list quick-tasks.yaml is not a recipe)."""
    assert len(SHIPPED) >= 15
    for path in SHIPPED:
        code, out, err = run_cli(["check", str(path)])
        assert code == (2 if path.name == "quick-tasks.yaml" else 0), f"{path}: {out}{err}"


@fuzz_settings(ci_examples=150)
@given(source=st.sampled_from(SHIPPED), data=st.data())
def test_a_mutated_recipe_is_accepted_or_refused_in_one_line(workdir, source, data):
    tree, done = data.draw(mutated_tree(_recipe(source)))
    extra = data.draw(st.one_of(st.just([]), overrides(tree)))
    text = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    _check(workdir, text, extra, f"{source.relative_to(REPO)} after {done} with {extra}")


@fuzz_settings(ci_examples=60)
@given(source=st.sampled_from(SHIPPED), data=st.data())
def test_a_recipe_with_broken_yaml_text_is_accepted_or_refused_in_one_line(workdir, source, data):
    text = data.draw(corrupted_text(source.read_text()))
    if data.draw(st.booleans()):
        raw = text.encode("utf-8", "surrogatepass")
        at = data.draw(st.integers(0, len(raw)))
        text = raw[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\x80\x80", b"\xfe\xff", b"\x00"])) + raw[at:]
    _check(workdir, text, [], f"{source.relative_to(REPO)} corrupted")


@fuzz_settings(ci_examples=40)
@given(source=st.sampled_from(SHIPPED), data=st.data())
def test_odd_overrides_on_a_shipped_recipe_are_accepted_or_refused_in_one_line(source, data):
    extra = data.draw(overrides(_recipe(source)))
    code, out, err = run_cli(["check", str(source), *extra])
    assert_clean_exit(code, out, err, f"{source.relative_to(REPO)} with {extra}")
