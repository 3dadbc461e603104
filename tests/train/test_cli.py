"""The command line: `llmfoundry train` and `python scripts/train.py` behave the same; bad input exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("entry", [["llmfoundry", "train"], [sys.executable, "scripts/train.py"]])
def test_misspelled_override_exits_2_naming_the_key_and_the_fix(entry):
    result = run(*entry, "yamls/quickstart.yaml", "model.n_layer=2")
    assert result.returncode == 2
    assert "model.n_layer: unknown key (did you mean 'model.n_layers'?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_problem_is_reported_at_once():
    result = run("llmfoundry", "train", "yamls/quickstart.yaml", "model.n_layer=2", "max_duration=ten",
                 "precision=fp8", "+optimizer.lrr=1")
    assert result.returncode == 2
    for expected in ("model.n_layer: unknown key", "max_duration: 'ten' is not a time", "precision: 'fp8' is not one of",
                     "optimizer.lrr: unknown key (did you mean 'optimizer.lr'?)"):
        assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_a_batch_that_does_not_split_across_n_processes_fails_before_any_is_started():
    result = run("llmfoundry", "train", "-n", "2", "yamls/quickstart.yaml", "global_train_batch_size=5",
                 "prepare_data.folder=/nonexistent/never-prepared")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: global_train_batch_size: 5 does not divide across 2 ranks "
                                     "(use a multiple of 2)")


def test_missing_recipe_is_a_clear_error():
    result = run("llmfoundry", "train", "yamls/no_such_recipe.yaml")
    assert result.returncode == 2
    assert "no such recipe file" in result.stderr


def test_train_and_script_entry_points_run_the_same_job(tmp_path, recipe):
    recipe_path = tmp_path / "tiny.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe(max_duration="3ba", eval_interval="3ba", log_to_console=True)))
    outputs = []
    for i, entry in enumerate([["llmfoundry", "train"], [sys.executable, str(REPO / "scripts/train.py")]]):
        folder = tmp_path / f"run{i}"
        result = run(*entry, str(recipe_path), f"save_folder={folder}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert (folder / "latest").read_text().strip() == "ep0-ba3"
        outputs.append([line for line in result.stdout.splitlines() if line.startswith("[eval]")])
    assert outputs[0] == outputs[1] and outputs[0]
