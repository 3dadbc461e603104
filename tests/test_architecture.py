"""The package's shape: imports at module level (so the layer contract in pyproject.toml sees the real graph) and
modules small enough to read. `lint-imports` (run by .ci/run) checks the layers themselves."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llmfoundry"
# Optional dependencies (extras, or heavy imports needed by one logger/feature only) may be imported where they
# are used, so that llmfoundry works without them. Everything else is imported at the top of its module.
OPTIONAL = {"peft", "lm_eval", "mlflow", "tensorboard", "torch.utils.tensorboard", "tiktoken", "flash_attn",
            "datasets", "matplotlib", "wandb", "boto3", "botocore", "ray", "bitsandbytes",
            "psutil", "pynvml", "gcsfs", "adlfs", "torchao"}
# A command checks its recipe before the heavy stack loads (a recipe mistake is answered in well under a second):
# its heavy stage is imported inside a function once the recipe is valid, and only in these places.
STAGED = {
    "llmfoundry/commands/train.py": {"llmfoundry.train.run"},
    "llmfoundry/commands/eval.py": {"llmfoundry.commands.eval_run"},
    "llmfoundry/commands/convert.py": {"llmfoundry.commands.convert_run"},
    "llmfoundry/commands/plan.py": {"llmfoundry.train.plan_report"},
    "llmfoundry/inference/generate.py": {"llmfoundry.inference.generate_run"},
    "llmfoundry/inference/chat.py": {"llmfoundry.inference.chat_session"},
    "llmfoundry/launch/ray.py": {"llmfoundry.launch.ray_worker"},  # with Ray itself, once the recipe is valid
}
MAX_LINES = 500


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imported_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return ["." * node.level + (node.module or "")]
    return []


def _is_optional(name: str) -> bool:
    return any(name == opt or name.startswith(opt + ".") for opt in OPTIONAL)


def function_level_imports(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``file:line name`` for every import inside a function or method of ``path`` that is not optional."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            for name in _imported_names(node):
                if not _is_optional(name) and name not in STAGED.get(path.relative_to(root).as_posix(), ()):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return sorted(set(found))


def test_imports_inside_functions_are_only_for_optional_dependencies():
    found = [line for path in _modules() for line in function_level_imports(path)]
    assert not found, f"{len(found)} imports inside functions (move them to the top of the module):\n" + "\n".join(found)


def test_the_counter_finds_an_import_inside_a_function(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    import json\n    import wandb\n    from . import x\n    return json\n")
    assert function_level_imports(sample, tmp_path) == ["sample.py:4 json", "sample.py:6 ."]


def test_no_module_is_longer_than_500_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


# train/ reads what a model declares (models.interface.hooks_of / the CausalLM members), never its attributes
MODEL_NAMES = ("model", "hf_model", "parallel_model", "wrapped", "base_model")


def _model_probes(tree: ast.AST) -> list[str]:
    """`getattr(X, ...)` / `hasattr(X, ...)` calls whose X is a model (a name or attribute from MODEL_NAMES)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            if name in MODEL_NAMES:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_train_never_probes_a_model_with_getattr_or_hasattr():
    probes = {str(path.relative_to(PACKAGE.parent)): found for path in sorted((PACKAGE / "train").rglob("*.py"))
              if (found := _model_probes(ast.parse(path.read_text())))}
    assert not probes, f"declare it in models.interface.ModelHooks instead: {probes}"


def test_train_imports_nothing_of_mpt_its_plans_come_from_the_model():
    """MPT's tensor- and expert-parallel plans live in models/mpt/ and reach train/ through ModelHooks."""
    found = [f"{path.relative_to(PACKAGE.parent)}: {name}" for path in sorted((PACKAGE / "train").rglob("*.py"))
             for name in _imported_modules(ast.parse(path.read_text())) if name.startswith("llmfoundry.models.mpt")]
    assert not found, found


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_the_probe_finder_sees_a_probe():
    code = "def f(trainer, model):\n    getattr(model, 'arch', None)\n    hasattr(trainer.model, 'x')\n    getattr(cfg, 'y')\n"
    assert [p.split(":")[0] for p in _model_probes(ast.parse(code))] == ["line 2", "line 3"]


# The whole recipe (TrainConfig) goes to few places; every other module gets its own section or plain values.
MAX_RECIPE_MODULES = 10


def _callee_modules(tree: ast.AST) -> dict[str, str]:
    """The module each imported name of ``tree`` comes from: ``compat`` -> llmfoundry.train.compat, ..."""
    origin = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                origin[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                origin[alias.asname or alias.name] = alias.name
    return origin


def _module_path(name: str, root: Path) -> Path | None:
    for candidate in (name, name.rsplit(".", 1)[0]):
        path = root / (candidate.replace(".", "/") + ".py")
        if path.exists():
            return path
    return None


def recipe_modules(start: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Modules the recipe object reaches from ``start`` (the trainer): those it is passed to as ``cfg`` (or the
    trainer itself, whose ``cfg`` they may read), followed through them, plus start itself. The trainer hands
    itself to its TrainState only as ``_services`` (RunServices: save, restore, ...), which is not counted."""
    carriers = {"cfg", "self.cfg", "trainer", "trainer.cfg"}
    reached, todo = set(), [start]
    while todo:
        path = todo.pop()
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        if name in reached:
            continue
        reached.add(name)
        tree = ast.parse(path.read_text())
        origin = _callee_modules(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            passed = [ast.unparse(a) for a in node.args]
            passed += [ast.unparse(k.value) for k in node.keywords if k.arg != "_services"]
            if not any(p in carriers or (path == start and p == "self") for p in passed):
                continue
            head = node.func
            while isinstance(head, ast.Attribute):
                head = head.value
            callee = _module_path(origin[head.id], root) if isinstance(head, ast.Name) and head.id in origin else None
            if callee is not None:
                todo.append(callee)
    return reached


def test_the_whole_recipe_reaches_few_modules():
    reached = recipe_modules(PACKAGE / "train" / "trainer.py")
    assert "llmfoundry.train.compat" in reached and "llmfoundry.eval.sections" in reached  # the finder finds them
    assert len(reached) <= MAX_RECIPE_MODULES, f"{len(reached)} modules get the whole recipe: {sorted(reached)}"
