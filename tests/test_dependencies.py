"""pyproject.toml says what the code uses: every third-party import of the package is a declared dependency (core
or an extra), and every core dependency is imported somewhere."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution, where the two differ (and for packages this machine need not have installed)
DISTRIBUTION_OF = {"yaml": "pyyaml", "flash_attn": "flash-attn", "pynvml": "nvidia-ml-py", "lm_eval": "lm-eval",
                   "mlflow": "mlflow-skinny", "streaming": "streaming-community", "huggingface_hub": "huggingface-hub"}
# imported by name through importlib (data/streaming_guard.import_streaming), so no import statement shows it
IMPORTED_BY_NAME = {"streaming"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for group in project["optional-dependencies"].values() for r in group}
    return core, extras


def third_party_imports(package: Path) -> set[str]:
    """Top-level names of the modules ``package`` imports, standard library and itself left out."""
    found = set(IMPORTED_BY_NAME)
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != package.name}


def _distribution(module: str) -> str:
    return DISTRIBUTION_OF.get(module, module).lower().replace("_", "-")


def test_every_import_is_declared():
    core, extras = _declared()
    undeclared = sorted(m for m in third_party_imports(ROOT / "llmfoundry") if _distribution(m) not in core | extras)
    assert not undeclared, f"imported but not in pyproject.toml's dependencies or extras: {undeclared}"


def test_every_core_dependency_is_imported():
    core, _ = _declared()
    used = {_distribution(m) for m in third_party_imports(ROOT / "llmfoundry")}
    unused = sorted(core - used)
    assert not unused, f"declared in pyproject.toml's dependencies but imported nowhere: {unused}"


def test_the_check_sees_an_undeclared_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("import os\nimport rich.console\nfrom pkg import m\nfrom . import x\n")
    assert third_party_imports(package) == {"rich"} | IMPORTED_BY_NAME
