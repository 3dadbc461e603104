"""The README's test command runs every test module under tests/.

pytest silently passes over folders whose names match its ``norecursedirs`` patterns (by default ``dist``,
``build``, ``venv``, ``.*``, ...): the multi-rank tests lived in tests/distributed and went unrun by CI for days.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def modules_of_tests() -> set[Path]:
    return {p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts}


def test_no_folder_of_tests_has_a_name_pytest_passes_over(request):
    patterns = request.config.getini("norecursedirs")
    passed_over = sorted({str(folder.relative_to(TESTS.parent)) for module in modules_of_tests()
                          for folder in module.relative_to(TESTS).parents
                          if folder != Path(".") and any(fnmatch.fnmatch(folder.name, p) for p in patterns)})
    assert not passed_over, f"pytest's norecursedirs ({patterns}) skips {passed_over}: rename the folder"


def test_a_run_of_the_whole_tree_collects_every_module(request):
    """When this session collected all of tests/ (CI, the README's command), each test module gave tests."""
    collected = {Path(str(item.path)).resolve() for item in request.session.items}
    whole_tree = all(Path(arg.split("::")[0]).resolve() == TESTS or Path(arg).resolve() in TESTS.parents
                     for arg in request.config.args)
    if not whole_tree or request.config.getoption("keyword") or request.config.getoption("markexpr"):
        pytest.skip("this session collected a selection; the whole tree's run (CI) checks it")
    missing = sorted(str(m.relative_to(TESTS.parent)) for m in modules_of_tests() - collected)
    assert not missing, f"test modules the whole-tree run did not collect: {missing}"
