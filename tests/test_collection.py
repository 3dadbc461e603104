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
    invoked = Path(request.config.invocation_params.dir)
    whole_tree = all((invoked / arg.split("::")[0]).resolve() in (TESTS, *TESTS.parents) for arg in request.config.args)
    narrowed = [option for option in ("keyword", "markexpr", "ignore", "ignore_glob", "deselect", "lf")
                if request.config.getoption(option, None)]
    if not whole_tree or narrowed:
        pytest.skip("this session collected a selection; the whole tree's run (CI) checks it")
    missing = sorted(str(m.relative_to(TESTS.parent)) for m in modules_of_tests() - collected
                     if not _skips_itself(m))
    assert not missing, f"test modules the whole-tree run did not collect: {missing}"


def _skips_itself(module: Path) -> bool:
    """A module that skips as a whole where an optional package is missing (``pytest.importorskip`` at its top)."""
    return any("pytest.importorskip(" in line and not line.startswith((" ", "\t"))
               for line in module.read_text().splitlines())
