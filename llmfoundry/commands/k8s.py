"""`llmfoundry k8s RECIPE.yaml [overrides] --nodes N --gpus-per-node G --image IMAGE [--kind trainjob|pytorchjob]`:
write the Kubernetes manifests of a training job (apply them with ``kubectl apply -f``).

The file holds a ConfigMap with the fully resolved recipe and a Kubeflow Trainer v2 TrainJob (default) or a
Training Operator PyTorchJob; see llmfoundry/launch/k8s.py and docs/clusters.md. Secrets in the recipe become
environment variables of the container, read from a Kubernetes Secret: one you name with ``--secret-env
NAME=secret/key``, or one written to ``<manifest>.secrets.yaml`` (readable by you alone; apply it, never commit it).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import yaml

from llmfoundry.commands.train import load_train_config
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.launch.k8s import KINDS, KubeJob, secret_name
from llmfoundry.launch.recipe import dns_label, recipe_text, resolved_recipe, secrets_to_env
from llmfoundry.train.compat import device_batch_size

# --secret-env NAME=SECRET/KEY: an environment variable name, a Kubernetes object name, a Secret's key
_SECRET_ENV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/([-._a-zA-Z0-9]+)$")


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
    parser.add_argument("--secret-env", action="append", default=[], metavar="NAME=SECRET/KEY",
                        help="the container's variable NAME from key KEY of the Kubernetes Secret SECRET (repeat "
                             "for more); a secret of the recipe read from NAME is then not written anywhere")
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
    named = secret_refs(args.secret_env)
    recipe, secrets, where = secrets_to_env(resolved_recipe(plain))
    name = dns_label(recipe["run_name"])
    to_write = {var: value for var, value in secrets.items() if var not in named}
    refs = {var: (secret_name(name), var) for var in to_write} | named
    job = KubeJob(name=name, image=args.image, nodes=args.nodes, gpus_per_node=args.gpus_per_node, kind=args.kind,
                  namespace=args.namespace, runtime=args.runtime, max_restarts=args.max_restarts, cpu=args.cpu,
                  secret_env=tuple((var, secret, key) for var, (secret, key) in refs.items()))
    out = Path(args.output or f"{job.name}.k8s.yaml")
    for var in secrets:
        secret, key = refs[var]
        notice_once(f"{where[var]}: a secret, not written to the recipe; the container reads it from ${var} "
                    f"(Secret {secret}, key {key})")
    out.write_text(yaml.safe_dump_all(job.manifests(recipe_text(recipe)), sort_keys=False))
    print(f"wrote {out}: ConfigMap {job.config_map} and {'TrainJob' if args.kind == 'trainjob' else 'PyTorchJob'} "
          f"{job.name} (kubectl apply -f {out})")
    secret_file = out.with_name(out.name.removesuffix(".yaml") + ".secrets.yaml")
    if not to_write and secret_file.exists():  # an earlier run's: this job references no Secret of ours
        secret_file.unlink()
        print(f"removed {secret_file}: this job's secrets come from --secret-env")
    if to_write:
        write_private(secret_file, yaml.safe_dump(job.secret_manifest(to_write), sort_keys=False))
        print(f"wrote {secret_file}: Secret {job.secret} with {', '.join(to_write)}. It holds credentials: readable "
              f"by you alone, kubectl apply -f it first, never commit it (or create the Secret yourself and pass "
              f"--secret-env)")
    return 0


def secret_refs(specs: list[str]) -> dict[str, tuple[str, str]]:
    """{variable: (Secret name, key)} of the --secret-env values."""
    refs = {}
    for spec in specs:
        match = _SECRET_ENV.match(spec)
        if match is None:
            raise ConfigError(f"--secret-env: '{spec}' (expected NAME=SECRET/KEY, e.g. HF_TOKEN=hf-secret/token)")
        refs[match.group(1)] = (match.group(2), match.group(4))
    return refs


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read, created so from the start (never world-readable)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(text)
