"""`llmfoundry k8s`: TrainJob / PyTorchJob manifests that validate against the CRDs' schemas (vendored in
tests/fixtures/k8s, sources named there), and whose container command trains when run with Kubeflow's PET_*."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from llmfoundry.launch.k8s import RECIPE_ENV, KubeJob
from tests.distributed.helpers import checkpoint_weights, worker_env
from tests.launch.launch_helpers import OWN_SHM, llmfoundry, write_recipe
from tests.planted_secrets import leaks

jsonschema = pytest.importorskip("jsonschema")
SCHEMAS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def _write_manifests(tmp_path, recipe_dict, *extra) -> list[dict]:
    recipe = write_recipe(recipe_dict, tmp_path)
    out = tmp_path / "job.k8s.yaml"
    result = llmfoundry(["k8s", str(recipe), "--nodes", "2", "--gpus-per-node", "4", "--image", "ghcr.io/me/lf:1",
                         "-o", str(out), *extra], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(out.read_text()))


@pytest.mark.parametrize("kind, schema", [("trainjob", "trainjob"), ("pytorchjob", "pytorchjob")])
def test_manifests_validate_against_the_crd_schemas(launch_recipe, tmp_path, kind, schema):
    config_map, job = _write_manifests(tmp_path, launch_recipe(tmp_path / "run", run_name="Tiny_Run.1",
                                                                global_train_batch_size=8), "--kind", kind,
                                       "+variables.hf_token=tok-12345678", "--secret-env", "WANDB_API_KEY=wandb/key")
    jsonschema.validate(config_map, _schema("configmap"))
    jsonschema.validate(job, _schema(schema))
    assert job["metadata"]["name"] == "tiny-run-1"
    recipe = yaml.safe_load(config_map["data"]["recipe.yaml"])
    assert recipe["run_name"] == "Tiny_Run.1" and recipe["autoresume"] is True  # the same recipe on every restart
    if kind == "trainjob":
        assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 4
        assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
    else:
        specs = job["spec"]["pytorchReplicaSpecs"]
        assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
        assert specs["Worker"]["restartPolicy"] == "OnFailure" and job["spec"]["runPolicy"]["backoffLimit"] == 3


def test_the_schemas_reject_what_the_crds_reject():
    job = KubeJob(name="ok", image="img", nodes=2, gpus_per_node=1).trainjob()
    jsonschema.validate(job, _schema("trainjob"))
    for broken in ({**job, "spec": {**job["spec"], "trainer": {**job["spec"]["trainer"], "numNode": 2}}},
                   {**job, "spec": {"trainer": job["spec"]["trainer"]}},
                   {**job, "metadata": {"name": "Not_A_Label"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, _schema("trainjob"))
    pytorch = KubeJob(name="ok", image="img", nodes=2, gpus_per_node=1, kind="pytorchjob").pytorchjob()
    pytorch["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    with pytest.raises(jsonschema.ValidationError):  # the operator only runs the container named pytorch
        jsonschema.validate(pytorch, _schema("pytorchjob"))


def test_a_recipe_without_save_folder_is_refused(launch_recipe, tmp_path):
    recipe = write_recipe(launch_recipe(tmp_path / "run", save_folder=None, autoresume=False), tmp_path)
    result = llmfoundry(["k8s", str(recipe), "--nodes", "1", "--gpus-per-node", "1", "--image", "x"], cwd=tmp_path)
    assert result.returncode == 2 and "save_folder: not set" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
@pytest.mark.slow
def test_the_container_command_trains_with_the_variables_kubeflow_injects(launch_recipe, tmp_path):
    """Two "pods" on 127.0.0.1: each runs the TrainJob's command with PET_* and the recipe from the ConfigMap, and
    with the variables of the Secret that `llmfoundry k8s` wrote for a token given as an override."""
    token = "planted-" + "7" * 24
    config_map, job = _write_manifests(tmp_path, launch_recipe(tmp_path / "run", run_name="pet"), "--cpu",
                                       f"+variables.hf_token={token}")
    secret = yaml.safe_load((tmp_path / "job.k8s.secrets.yaml").read_text())
    secret_env = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    assert secret_env == {"HF_TOKEN": token} and token not in json.dumps([config_map, job])
    command = job["spec"]["trainer"]["command"]
    assert "nvidia.com/gpu" not in json.dumps(job)
    port = str(_free_port())
    procs = []
    for node_rank in range(2):
        pod_tmp = tmp_path / f"pod{node_rank}"
        pod_tmp.mkdir()
        env = dict(worker_env(), TMPDIR=str(pod_tmp), PET_NNODES="2", PET_NPROC_PER_NODE="1",
                   PET_NODE_RANK=str(node_rank), PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=port,
                   **{RECIPE_ENV: config_map["data"]["recipe.yaml"]}, **secret_env)
        with open(tmp_path / f"pod{node_rank}.log", "w") as log:
            procs.append(subprocess.Popen([*OWN_SHM, *command], env=env, cwd=tmp_path, stdout=log,
                                          stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], (tmp_path / "pod0.log").read_text()[-3000:]
    assert (tmp_path / "pod1" / "llmfoundry-recipe.yaml").exists()
    assert len(checkpoint_weights(tmp_path / "run" / "ckpt" / "ep0-ba10")) > 0
    assert not leaks([token], tmp_path)  # pod logs, recipe copies, checkpoints; the Secret file holds it in base64
    rows = [json.loads(line) for p in (tmp_path / "run").glob("samples-2x-rank*.jsonl")
            for line in p.read_text().splitlines()]
    assert sorted({r["rank"] for r in rows}) == [0, 1] and len(rows) == 20  # 2 ranks x 10 batches
