"""`llmfoundry k8s` and `llmfoundry slurm` write no secret: tokens planted every way a user gives one
(tests/planted_secrets.py) become environment variables of the job, read by the recipe with ${oc.env:NAME}.
(The real Slurm job that gets its token this way: test_slurm_cluster.py's test_a; the pods that train with the
Secret's variables: test_k8s_manifests.py.)"""

from __future__ import annotations

import base64
import os
import re
import stat
import subprocess

import pytest
import yaml

from tests.launch.launch_helpers import llmfoundry, write_recipe
from tests.planted_secrets import leaks, plant


@pytest.fixture
def planted(monkeypatch):
    planted = plant()
    for name, value in planted.env.items():
        monkeypatch.setenv(name, value)
    return planted


def _k8s(tmp_path, recipe_dict, *extra):
    recipe = write_recipe(recipe_dict, tmp_path)  # the user's own file, outside the folder searched
    out = tmp_path / "out"
    out.mkdir()
    result = llmfoundry(["k8s", str(recipe), "--nodes", "1", "--gpus-per-node", "1", "--image", "img", "-o",
                         str(out / "sec.k8s.yaml"), *extra], cwd=out)
    assert result.returncode == 0, result.stderr
    return out, result


def _container_env(job: dict) -> dict[str, dict]:
    return {item["name"]: item for item in job["spec"]["trainer"]["env"]}


def test_k8s_puts_the_secrets_in_a_secret_file_and_references_them(launch_recipe, tmp_path, planted, caplog):
    out, result = _k8s(tmp_path, planted.recipe(launch_recipe(tmp_path / "run", run_name="sec")),
                       *planted.overrides)
    config_map, job = yaml.safe_load_all((out / "sec.k8s.yaml").read_text())
    recipe = yaml.safe_load(config_map["data"]["recipe.yaml"])
    assert recipe["variables"]["hf_token"] == "${oc.env:HF_TOKEN}"
    assert recipe["variables"]["mirror"].startswith("https://someone:${oc.env:")
    secret_file = out / "sec.k8s.secrets.yaml"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = yaml.safe_load(secret_file.read_text())
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "sec-secrets"
    values = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    env = _container_env(job)
    for name, value in values.items():  # every secret the recipe reads comes from that Secret
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "sec-secrets", "key": name}
        assert f"${{oc.env:{name}}}" in config_map["data"]["recipe.yaml"]
    # the override wins HF_TOKEN; the environment's HF_TOKEN (copied by an interpolation) travels under another name
    assert values["HF_TOKEN"] == planted.tokens["override"]
    assert set(values.values()) == {planted.tokens[how] for how in ("override", "recipe", "interpolation", "env",
                                                                    "url")}
    assert "credentials" in result.stdout and "variables.hf_token: a secret" in caplog.text  # notices
    texts = {"stdout": result.stdout, "stderr": result.stderr, "notices": caplog.text}
    assert not leaks(planted.tokens.values(), out, texts=texts)


def test_k8s_secret_env_references_the_users_secret_and_writes_no_secret_file(launch_recipe, tmp_path, planted):
    recipe = launch_recipe(tmp_path / "run", run_name="named")
    recipe["variables"] = {"hf_token": planted.tokens["recipe"]}
    out, _ = _k8s(tmp_path, recipe, "--secret-env", "HF_TOKEN=hub/token")
    _, job = yaml.safe_load_all((out / "sec.k8s.yaml").read_text())
    assert _container_env(job)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hub", "key": "token"}
    assert [p.name for p in out.iterdir()] == ["sec.k8s.yaml"]
    assert not leaks(planted.tokens.values(), out)


def test_a_bad_secret_env_is_one_line(launch_recipe, tmp_path):
    recipe = write_recipe(launch_recipe(tmp_path / "run"), tmp_path)
    result = llmfoundry(["k8s", str(recipe), "--nodes", "1", "--gpus-per-node", "1", "--image", "x",
                         "--secret-env", "HF_TOKEN"], cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--secret-env: 'HF_TOKEN' (expected NAME=SECRET/KEY" in result.stderr


def test_slurm_writes_no_secret_and_the_script_stops_when_one_is_missing(launch_recipe, tmp_path, planted, caplog):
    recipe = write_recipe(planted.recipe(launch_recipe(tmp_path / "run")), tmp_path)
    run = tmp_path / "slurm-run"
    result = llmfoundry(["slurm", str(recipe), "--nodes", "1", "--gpus-per-node", "1", "--cpu", "--run-dir",
                         str(run), "--dry-run", *planted.overrides], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    texts = {"stdout": result.stdout, "stderr": result.stderr, "notices": caplog.text}
    assert not leaks(planted.tokens.values(), run, texts=texts)
    submitted = (run / "slurm" / "recipe.yaml").read_text()
    names = sorted(set(re.findall(r"\$\{oc\.env:([A-Z0-9_]+)\}", submitted)))
    assert "HF_TOKEN" in names and "MY_SERVICE_TOKEN" in names and len(names) == 5
    script = (run / "slurm" / "job.sbatch").read_text()
    for name in names:
        assert f': "${{{name}:?llmfoundry: {name} is not set' in script
    # this environment's HF_TOKEN is not the override's: the notice says so, naming no value
    assert ("variables.hf_token: a secret, not written to the recipe; the job reads it from $HF_TOKEN (this "
            "environment's $HF_TOKEN holds another value: export the one given before you submit)") in caplog.text
    # the check line itself: bash stops with the variable's name when it is unset, and passes when it is set
    check = next(line for line in script.splitlines() if line.startswith(': "${HF_TOKEN'))
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    missing = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "HF_TOKEN is not set in the environment of the job" in missing.stderr
    assert subprocess.run(["bash", "-c", check], env={**env, "HF_TOKEN": "x"}).returncode == 0
