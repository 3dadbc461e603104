"""Kubernetes manifests of `llmfoundry k8s`: a ConfigMap with the resolved recipe, and a Kubeflow Trainer v2
``TrainJob`` (or a Training Operator ``PyTorchJob``, as SageMaker HyperPod on EKS documents) running torchrun.

The recipe reaches the container through an environment variable filled from the ConfigMap (``configMapKeyRef``:
no volume, so no version-specific pod override field); the container command writes it to a file and starts
torchrun with the node count, rank and master that Kubeflow injects (``PET_*``; a PyTorchJob's ``MASTER_ADDR``,
``RANK``, ``WORLD_SIZE`` otherwise). A pod that fails or is evicted (SIGTERM: checkpoint, exit 143) is restarted
and autoresumes: ``restartPolicy: OnFailure`` with ``backoffLimit`` for a PyTorchJob; for a TrainJob the
runtime's JobSet ``failurePolicy.maxRestarts`` decides (see docs/clusters.md).

Secrets never enter the ConfigMap: the recipe reads each one with ``${oc.env:NAME}`` and the container's NAME
comes from a Kubernetes Secret (``secretKeyRef``): one the user names (``--secret-env NAME=secret/key``), or the
Secret `llmfoundry k8s` writes to a file of its own (``secret_manifest``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

RECIPE_ENV = "LLMFOUNDRY_RECIPE"
RECIPE_KEY = "recipe.yaml"
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
PYTORCHJOB_API = "kubeflow.org/v1"
KINDS = ("trainjob", "pytorchjob")


def secret_name(job_name: str) -> str:
    """The Secret that `llmfoundry k8s` writes for the secrets given to it."""
    return f"{job_name}-secrets"


@dataclass(frozen=True)
class KubeJob:
    name: str  # a DNS label: the TrainJob/PyTorchJob and (with -recipe) the ConfigMap
    image: str
    nodes: int
    gpus_per_node: int
    kind: str = "trainjob"
    namespace: str | None = None
    runtime: str = "torch-distributed"  # the ClusterTrainingRuntime a TrainJob uses
    max_restarts: int = 3
    cpu: bool = False  # no nvidia.com/gpu request (CPU pods, gloo)
    secret_env: tuple[tuple[str, str, str], ...] = ()  # (variable, Secret name, key in that Secret)

    @property
    def config_map(self) -> str:
        return f"{self.name}-recipe"

    @property
    def secret(self) -> str:
        return secret_name(self.name)

    def command(self) -> list[str]:
        """The container command: the same for both kinds and for a local run with PET_* variables."""
        script = (f'recipe="${{TMPDIR:-/tmp}}/llmfoundry-recipe.yaml"; printf "%s" "${RECIPE_ENV}" > "$recipe" && '
                  'exec torchrun --nnodes="${PET_NNODES:-${WORLD_SIZE:-1}}" '
                  f'--nproc-per-node="${{PET_NPROC_PER_NODE:-{self.gpus_per_node}}}" '
                  '--node-rank="${PET_NODE_RANK:-${RANK:-0}}" '
                  '--master-addr="${PET_MASTER_ADDR:-${MASTER_ADDR:-127.0.0.1}}" '
                  '--master-port="${PET_MASTER_PORT:-${MASTER_PORT:-29500}}" '
                  '-m llmfoundry.cli train "$recipe"')
        return ["sh", "-c", script]

    def env(self) -> list[dict]:
        secrets = [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                   for name, secret, key in self.secret_env]
        return [{"name": RECIPE_ENV, "valueFrom": {"configMapKeyRef": {"name": self.config_map, "key": RECIPE_KEY}}},
                {"name": "PYTHONUNBUFFERED", "value": "1"}, *secrets]

    def resources(self) -> dict:
        if self.cpu:
            return {}
        gpus = str(self.gpus_per_node)
        return {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}

    def _metadata(self, name: str) -> dict:
        meta = {"name": name, "labels": {"app.kubernetes.io/name": "llmfoundry", "llmfoundry/run": self.name}}
        if self.namespace:
            meta["namespace"] = self.namespace
        return meta

    def config_map_manifest(self, recipe_text: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._metadata(self.config_map),
                "data": {RECIPE_KEY: recipe_text}}

    def secret_manifest(self, values: dict[str, str]) -> dict:
        """The Secret holding ``values`` (variable -> secret), base64-encoded as Kubernetes stores them."""
        return {"apiVersion": "v1", "kind": "Secret", "metadata": self._metadata(self.secret), "type": "Opaque",
                "data": {name: base64.b64encode(value.encode()).decode() for name, value in values.items()}}

    def trainjob(self) -> dict:
        trainer = {"image": self.image, "command": self.command(), "env": self.env(), "numNodes": self.nodes,
                   "numProcPerNode": self.gpus_per_node}
        if self.resources():
            trainer["resourcesPerNode"] = self.resources()
        return {"apiVersion": TRAINJOB_API, "kind": "TrainJob", "metadata": self._metadata(self.name),
                "spec": {"runtimeRef": {"name": self.runtime}, "trainer": trainer}}

    def pytorchjob(self) -> dict:
        container = {"name": "pytorch", "image": self.image, "command": self.command(), "env": self.env()}
        if self.resources():
            container["resources"] = self.resources()

        def replicas(count: int) -> dict:
            return {"replicas": count, "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container]}}}

        specs = {"Master": replicas(1)}
        if self.nodes > 1:
            specs["Worker"] = replicas(self.nodes - 1)
        return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": self._metadata(self.name),
                "spec": {"nprocPerNode": str(self.gpus_per_node),
                         "runPolicy": {"backoffLimit": self.max_restarts, "cleanPodPolicy": "None"},
                         "pytorchReplicaSpecs": specs}}

    def manifests(self, recipe_text: str) -> list[dict]:
        job = self.trainjob() if self.kind == "trainjob" else self.pytorchjob()
        return [self.config_map_manifest(recipe_text), job]
