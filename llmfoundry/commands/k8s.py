"""`llmfoundry k8s RECIPE.yaml [overrides] --nodes N --gpus-per-node G --image IMAGE [--kind trainjob|pytorchjob]`:
write the Kubernetes manifests of a training job (apply them with ``kubectl apply -f``).

The file holds a ConfigMap with the fully resolved recipe and a Kubeflow Trainer v2 TrainJob (default) or a
Training Operator PyTorchJob; see llmfoundry/launch/k8s.py and docs/clusters.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from llmfoundry.commands.train import load_train_config
from llmfoundry.core.errors import ConfigError
from llmfoundry.launch.k8s import KINDS, KubeJob
from llmfoundry.launch.recipe import dns_label, recipe_text, resolved_recipe
from llmfoundry.train.compat import device_batch_size


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmfoundry k8s", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="path of the YAML recipe (its paths must be valid inside the container)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, resolved into the ConfigMap's recipe")
    parser.add_argument("--nodes", type=int, required=True, help="pods (one torchrun each)")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per pod = processes per pod")
    parser.add_argument("--image", required=True, help="container image with llmfoundry installed")
    parser.add_argument("--kind", choices=KINDS, default="trainjob",
                        help="trainjob (Kubeflow Trainer v2, default) or pytorchjob (Training Operator v1)")
    parser.add_argument("--namespace", help="metadata.namespace of every manifest")
    parser.add_argument("--runtime", default="torch-distributed", help="the TrainJob's ClusterTrainingRuntime")
    parser.add_argument("--max-restarts", type=int, default=3, help="PyTorchJob runPolicy.backoffLimit (default 3)")
    parser.add_argument("--cpu", action="store_true", help="request no GPUs (CPU pods, gloo)")
    parser.add_argument("--output", "-o", help="the manifest file (default: <run_name>.k8s.yaml here)")
    return parser.parse_intermixed_args(argv)  # overrides may come after the options


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise ConfigError(f"--nodes/--gpus-per-node: {args.nodes}/{args.gpus_per_node} (use 1 or more each)")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts: {args.max_restarts} (use 0 or more)")
    cfg, plain = load_train_config(args.recipe, args.overrides)
    device_batch_size(cfg.global_train_batch_size, args.nodes * args.gpus_per_node, cfg.tp_config)
    recipe = resolved_recipe(plain)
    job = KubeJob(name=dns_label(recipe["run_name"]), image=args.image, nodes=args.nodes,
                  gpus_per_node=args.gpus_per_node, kind=args.kind, namespace=args.namespace, runtime=args.runtime,
                  max_restarts=args.max_restarts, cpu=args.cpu)
    out = Path(args.output or f"{job.name}.k8s.yaml")
    out.write_text(yaml.safe_dump_all(job.manifests(recipe_text(recipe)), sort_keys=False))
    print(f"wrote {out}: ConfigMap {job.config_map} and {'TrainJob' if args.kind == 'trainjob' else 'PyTorchJob'} "
          f"{job.name} (kubectl apply -f {out})")
    return 0
