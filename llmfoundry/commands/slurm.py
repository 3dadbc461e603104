"""`llmfoundry slurm RECIPE.yaml [overrides] --nodes N --gpus-per-node G`: submit a training job to Slurm.

Writes <run folder>/slurm/job.sbatch and the fully resolved recipe beside it, then runs ``sbatch --parsable``
(``--dry-run`` stops after writing). See llmfoundry/launch/slurm.py for what the script does, docs/clusters.md
for preemption, requeue and SageMaker HyperPod.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from llmfoundry.commands.train import load_train_config
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.launch.recipe import dns_label, recipe_text, resolved_recipe, secrets_to_env
from llmfoundry.launch.slurm import SlurmJob, is_hyperpod, write_job
from llmfoundry.train.compat import device_batch_size


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmfoundry slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="path of the YAML recipe")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, resolved into the submitted recipe")
    parser.add_argument("--nodes", type=int, required=True, help="nodes (one srun task, one torchrun each)")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per node = processes per node")
    parser.add_argument("--partition", help="sbatch --partition")
    parser.add_argument("--account", help="sbatch --account")
    parser.add_argument("--time", help="sbatch --time, e.g. 04:00:00")
    parser.add_argument("--qos", help="sbatch --qos")
    parser.add_argument("--container-image", help="run in this image (pyxis/enroot: srun --container-image)")
    parser.add_argument("--max-requeues", type=int, default=3,
                        help="requeue the job after a preemption checkpoint at most this many times (default 3)")
    parser.add_argument("--signal", default="USR2@300",
                        help="signal sent to the batch shell this many seconds before the time limit (default "
                             "USR2@300, i.e. sbatch --signal=B:USR2@300)")
    parser.add_argument("--hyperpod", choices=("auto", "on", "off"), default="auto",
                        help="SageMaker HyperPod: srun --auto-resume=1 and no self-requeue (auto: detected from "
                             "/opt/sagemaker_cluster)")
    parser.add_argument("--cpu", action="store_true",
                        help="processes run on CPUs (gloo): request no GPUs and not the whole node")
    parser.add_argument("--run-dir", help="the run folder (default: runs/<run_name> under this folder)")
    parser.add_argument("--dry-run", action="store_true", help="write the script and recipe, do not submit")
    return parser.parse_intermixed_args(argv)  # overrides may come after the options


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cfg, plain = load_train_config(args.recipe, args.overrides)
    if args.nodes >= 1 and args.gpus_per_node >= 1:  # the global batch must split over every process
        device_batch_size(cfg.global_train_batch_size, args.nodes * args.gpus_per_node, cfg.tp_config)
    recipe, secrets, where = secrets_to_env(resolved_recipe(plain))
    workdir = Path.cwd().resolve()
    run_dir = Path(args.run_dir).resolve() if args.run_dir else workdir / "runs" / recipe["run_name"]
    job = SlurmJob(run_dir=run_dir, workdir=workdir, job_name=dns_label(recipe["run_name"]), nodes=args.nodes,
                   gpus_per_node=args.gpus_per_node, partition=args.partition, account=args.account,
                   time=args.time, qos=args.qos, container_image=args.container_image,
                   max_requeues=args.max_requeues, signal=args.signal, hyperpod=is_hyperpod(args.hyperpod),
                   cpu=args.cpu, secret_env=tuple(secrets))
    script = write_job(job, recipe_text(recipe))
    print(f"wrote {script} and {job.recipe_path}")
    given = {name: value for name, value in secrets.items() if os.environ.get(name) != value}
    for name in secrets:
        if name not in given or not args.dry_run:
            how = "sbatch exports it from this environment"
        elif name in os.environ:  # a later sbatch would hand the job this environment's other value
            how = f"this environment's ${name} holds another value: export the one given before you submit"
        else:
            how = "export it in the environment you submit from"
        notice_once(f"{where[name]}: a secret, not written to the recipe; the job reads it from ${name} ({how})")
    if args.dry_run:
        return 0
    if shutil.which("sbatch") is None:
        raise ConfigError("sbatch: not found on PATH (run on a Slurm login node, or use --dry-run and submit "
                          f"{script} yourself)")
    # the secrets given here reach the job through the environment sbatch exports, never through a file
    result = subprocess.run(["sbatch", "--parsable", str(script)], check=False, capture_output=True, text=True,
                            env={**os.environ, **given})
    if result.returncode != 0:
        print(f"error: sbatch failed: {result.stderr.strip()}", file=sys.stderr)
        return result.returncode
    job_id = result.stdout.strip().split(";")[0]
    print(f"submitted job {job_id}; log: {job.slurm_dir}/{job.job_name}-{job_id}.out")
    print(job_id)
    return 0
