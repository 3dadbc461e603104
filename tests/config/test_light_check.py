"""A recipe is checked, and a recipe mistake answered, without loading the heavy stack: torch, transformers and
streaming stay out of the process until something is built (issue #28). Each case runs the real CLI in a fresh
interpreter and reads that interpreter's own ``sys.modules`` when it is done."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmfoundry import registry
from llmfoundry.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "streaming")
# Runs `llmfoundry <argv>` in this interpreter, then prints which heavy packages it imported (a --help exits
# through SystemExit: the report is printed in any case).
DRIVER = textwrap.dedent("""
    import json, sys
    from llmfoundry.cli import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as stop:
        code = stop.code
    print("HEAVY " + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
    sys.exit(code)
""").format(heavy=HEAVY)


def run_cli(*argv: str) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout without the report, stderr, heavy packages imported) of ``llmfoundry *argv``."""
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.splitlines()
    assert lines and lines[-1].startswith("HEAVY "), done.stdout + done.stderr
    return done.returncode, "\n".join(lines[:-1]), done.stderr, json.loads(lines[-1][len("HEAVY "):])


@pytest.mark.parametrize("recipe", ["yamls/quickstart.yaml", "yamls/mpt/125m.yaml", "yamls/eval/quickstart.yaml"])
def test_check_validates_a_recipe_without_torch_transformers_or_streaming(recipe):
    code, out, err, heavy = run_cli("check", recipe)
    assert code == 0, out + err
    assert "valid" in out
    assert heavy == []


def test_a_train_recipe_typo_is_answered_in_one_line_without_the_heavy_stack():
    code, out, err, heavy = run_cli("train", "yamls/quickstart.yaml", "model.n_layer=2")
    assert code == 2
    assert err.strip() == "error: model.n_layer: unknown key (did you mean 'model.n_layers'?)"
    assert heavy == []


def test_an_eval_recipe_mistake_is_answered_without_the_heavy_stack():
    code, out, err, heavy = run_cli("eval", "yamls/eval/quickstart.yaml", "device_eval_batch_sise=2")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "device_eval_batch_sise" in err
    assert heavy == []


@pytest.mark.parametrize("argv", [["--help"]] + [[command, "--help"] for command in COMMANDS])
def test_help_stays_light(argv):
    code, out, err, heavy = run_cli(*argv)
    assert code == 0, err
    assert "usage" in out
    assert heavy == []


def test_a_valid_recipe_does_load_torch_when_it_is_run(tmp_path):
    """The driver sees a heavy import when there is one (so the assertions above can fail): a valid recipe whose
    data folder is missing fails in the trainer, after the stack has loaded."""
    code, out, err, heavy = run_cli("train", "yamls/quickstart.yaml", f"variables.data_local={tmp_path / 'none'}",
                                    "prepare_data=null")
    assert code == 2, err
    assert "torch" in heavy


@pytest.mark.parametrize("kind", ["models", "dataloaders", "optimizers", "schedulers", "algorithms", "callbacks",
                                  "loggers"])
def test_every_declared_builder_imports(kind):
    """A catalog names each builder by a string: each one must import, and be the function it names."""
    reg = getattr(registry, kind)
    for name in reg.names():
        entry = reg.get(name)
        builder = entry.builder
        assert callable(builder), f"{kind} '{name}': {entry.target!r} is not callable"
        if isinstance(entry.target, str):
            module, _, attribute = entry.target.partition(":")
            assert (builder.__module__, builder.__name__) == (module, attribute), f"{kind} '{name}'"
