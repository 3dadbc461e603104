"""`llmfoundry slurm --dry-run`: the batch script and the resolved recipe it runs (no Slurm needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from llmfoundry.core.errors import ConfigError
from llmfoundry.launch.slurm import SlurmJob, batch_signal, is_hyperpod
from tests.launch.launch_helpers import llmfoundry, write_recipe


def _dry_run(tmp_path, recipe_dict, *extra) -> tuple[str, dict, subprocess.CompletedProcess]:
    recipe = write_recipe(recipe_dict, tmp_path)
    result = llmfoundry(["slurm", str(recipe), "--nodes", "2", "--gpus-per-node", "4", "--run-dir",
                         str(tmp_path / "run"), "--dry-run", *extra], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    slurm = tmp_path / "run" / "slurm"
    return (slurm / "job.sbatch").read_text(), yaml.safe_load((slurm / "recipe.yaml").read_text()), result


def test_the_script_runs_one_torchrun_per_node_with_c10d_on_the_first_host(launch_recipe, tmp_path):
    script, recipe, _ = _dry_run(tmp_path, launch_recipe(tmp_path / "r", autoresume=False), "--partition", "gpu",
                                 "--account", "proj", "--time", "04:00:00", "--qos", "high")
    for directive in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--exclusive", "--open-mode=append",
                      "--requeue", "--signal=B:USR2@300", "--partition=gpu", "--account=proj", "--time=04:00:00",
                      "--qos=high"):
        assert f"#SBATCH {directive}\n" in script, directive
    assert 'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert "PORT=$((20000 + SLURM_JOB_ID % 20000))" in script
    assert '--nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT"' in script
    assert "trap " in script and " USR2\n" in script and "MAX_REQUEUES=3" in script
    assert "--auto-resume" not in script
    # the resolved recipe: fixed run name, autoresume on, no overrides left to re-apply
    assert recipe["autoresume"] is True and recipe["run_name"].startswith("llmfoundry-")
    assert f'RECIPE={tmp_path / "run" / "slurm" / "recipe.yaml"}' in script
    assert subprocess.run(["bash", "-n", str(tmp_path / "run" / "slurm" / "job.sbatch")], check=False).returncode == 0


def test_hyperpod_uses_auto_resume_and_no_self_requeue(launch_recipe, tmp_path):
    script, _, _ = _dry_run(tmp_path, launch_recipe(tmp_path / "r"), "--hyperpod", "on", "--max-requeues", "5",
                            "--container-image", "nvcr.io/me/lf:1")
    assert "--auto-resume=1" in script and "#SBATCH --no-requeue" in script and "MAX_REQUEUES=0" in script
    assert "--container-image=nvcr.io/me/lf:1" in script and "    python -m torch.distributed.run" in script


def test_hyperpod_is_detected_from_its_marker(tmp_path):
    assert not is_hyperpod("auto", tmp_path / "missing")
    (tmp_path / "sagemaker_cluster").mkdir()
    marker = tmp_path / "sagemaker_cluster"
    assert is_hyperpod("auto", marker) and not is_hyperpod("off", marker)


def test_overrides_are_resolved_into_the_submitted_recipe(launch_recipe, tmp_path):
    _, recipe, _ = _dry_run(tmp_path, launch_recipe(tmp_path / "r"), "max_duration=4ba", "run_name=fixed",
                            "global_train_batch_size=16")
    assert recipe["max_duration"] == "4ba" and recipe["run_name"] == "fixed"


@pytest.mark.parametrize("overrides, extra, message", [
    ({"save_folder": None, "autoresume": False}, (), "save_folder: not set"),
    ({"save_folder": "ckpt/{run_name}"}, (), "run_name: not set while save_folder"),
    ({"global_train_batch_size": 6}, (), "global_train_batch_size: 6 does not divide across 8 ranks"),
    ({}, ("--signal", "TERM@60"), "--signal: SIGTERM would end the batch script"),
])
def test_what_cannot_resume_is_refused_with_one_line(launch_recipe, tmp_path, overrides, extra, message):
    recipe = write_recipe(launch_recipe(tmp_path / "r", **overrides), tmp_path)
    result = llmfoundry(["slurm", str(recipe), "--nodes", "2", "--gpus-per-node", "4", "--dry-run", *extra],
                        cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_signal_specs():
    assert batch_signal("USR2@300") == ("USR2", 300) and batch_signal("B:SIGUSR1@90") == ("USR1", 90)
    with pytest.raises(ConfigError):
        batch_signal("USR2 at 300")
    with pytest.raises(ConfigError):
        SlurmJob(run_dir=Path("r"), workdir=Path("."), job_name="j", nodes=0, gpus_per_node=1).check()
