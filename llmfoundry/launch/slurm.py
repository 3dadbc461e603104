"""The Slurm batch script of `llmfoundry slurm`: one ``srun`` task per node, each running torchrun.

torchrun's c10d rendezvous runs on the first host of the allocation, on a port derived from the job id. The
preemption signal (``--signal=B:USR2@300``) goes to the batch shell only: torchrun does not handle SIGUSR2, so the
shell turns it into a flag file that the trainer watches (train/preemption.py). When the trainer stops with the
requeue code, the script requeues its own job (``scontrol requeue``) while ``SLURM_RESTART_COUNT`` is under
``--max-requeues``; the requeued job runs this same script and recipe and autoresumes. On SageMaker HyperPod,
``srun --auto-resume=1`` replaces a failed node and re-runs the step instead, and the script does not requeue.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.preemption_protocol import (
    EXIT_FILE_ENV,
    FLAG_FILE_ENV,
    REQUEUE_EXIT_CODE,
    signal_number,
)

HYPERPOD_MARKER = Path("/opt/sagemaker_cluster")  # present on SageMaker HyperPod cluster nodes
_SIGNAL_SPEC = re.compile(r"^(?:[BR]:)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?$")


def is_hyperpod(choice: str, marker: Path = HYPERPOD_MARKER) -> bool:
    if choice not in ("auto", "on", "off"):
        raise ConfigError(f"--hyperpod: '{choice}' (use auto, on or off)")
    return marker.is_dir() if choice == "auto" else choice == "on"


def batch_signal(spec: str) -> tuple[str, int]:
    """(signal name without SIG, seconds ahead) of a --signal value such as 'USR2@300' or 'B:USR2@300'."""
    match = _SIGNAL_SPEC.match(spec.strip().upper())
    if match is None:
        raise ConfigError(f"--signal: '{spec}' (expected NAME@SECONDS, e.g. USR2@300)")
    name, seconds = match.group(1), int(match.group(2) or 60)
    try:
        signal_number(name)
    except ValueError as error:
        raise ConfigError(f"--signal: {error}") from None
    if name in ("TERM", "KILL"):
        raise ConfigError(f"--signal: SIG{name} would end the batch script itself (use USR1 or USR2)")
    return name, seconds


@dataclass(frozen=True)
class SlurmJob:
    """What `llmfoundry slurm` was asked for; ``script()`` is the batch script."""

    run_dir: Path  # <run folder>; the script, the recipe and the logs go in <run folder>/slurm
    workdir: Path  # where the job runs (relative paths of the recipe are relative to it)
    job_name: str
    nodes: int
    gpus_per_node: int  # torchrun processes per node
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    container_image: str | None = None
    max_requeues: int = 3
    signal: str = "USR2@300"
    hyperpod: bool = False
    cpu: bool = False  # processes on CPUs (gloo): no GPUs requested, the node not taken exclusively
    python: str = sys.executable
    secret_env: tuple[str, ...] = ()  # variables the recipe reads its secrets from (sbatch exports them)

    @property
    def slurm_dir(self) -> Path:
        return self.run_dir / "slurm"

    @property
    def script_path(self) -> Path:
        return self.slurm_dir / "job.sbatch"

    @property
    def recipe_path(self) -> Path:
        return self.slurm_dir / "recipe.yaml"

    def check(self) -> None:
        if self.nodes < 1:
            raise ConfigError(f"--nodes: {self.nodes} (use 1 or more)")
        if self.gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node: {self.gpus_per_node} (use 1 or more processes per node)")
        if self.max_requeues < 0:
            raise ConfigError(f"--max-requeues: {self.max_requeues} (use 0 or more)")
        batch_signal(self.signal)

    def directives(self) -> list[str]:
        name, ahead = batch_signal(self.signal)
        lines = [f"--job-name={self.job_name}", f"--nodes={self.nodes}", "--ntasks-per-node=1",
                 f"--output={self.slurm_dir}/%x-%j.out", "--open-mode=append", f"--chdir={self.workdir}",
                 f"--signal=B:{name}@{ahead}"]
        if not self.cpu:
            lines += [f"--gpus-per-node={self.gpus_per_node}", "--exclusive"]
        lines += [f"--{key}={value}" for key, value in (("partition", self.partition), ("account", self.account),
                                                       ("time", self.time), ("qos", self.qos)) if value]
        lines.append("--no-requeue" if self.hyperpod else "--requeue")
        return [f"#SBATCH {line}" for line in lines]

    def srun_args(self) -> list[str]:
        args = ['--ntasks="$NTASKS"', "--kill-on-bad-exit=1"]
        if self.hyperpod:
            args.append("--auto-resume=1")  # HyperPod replaces a failed node and re-runs this step
        if self.container_image:
            mounts = ",".join(sorted({f"{self.workdir}:{self.workdir}", f"{self.run_dir}:{self.run_dir}"}))
            args += [f"--container-image={shlex.quote(self.container_image)}", f"--container-mounts={mounts}",
                     f"--container-workdir={self.workdir}"]
        return args

    def torchrun(self) -> list[str]:
        python = "python" if self.container_image else shlex.quote(self.python)
        return [python, "-m", "torch.distributed.run", '--nnodes="$NTASKS"', f"--nproc-per-node={self.gpus_per_node}",
                "--rdzv-backend=c10d", '--rdzv-endpoint="$HEAD:$PORT"', '--rdzv-id="$SLURM_JOB_ID"',
                "-m", "llmfoundry.cli", "train", '"$RECIPE"']

    def secret_checks(self) -> str:
        """Lines that stop the job at once, naming the variable, when a secret the recipe reads is not set."""
        if not self.secret_env:
            return ""
        lines = ["# The recipe reads its secrets from these variables (never written into it); sbatch exports the",
                 "# submitting shell's environment to the job."]
        lines += [f': "${{{name}:?llmfoundry: {name} is not set in the environment of the job '
                  f'(export it, then submit again)}}"' for name in self.secret_env]
        return "\n".join(lines) + "\n"

    def script(self) -> str:
        name, _ = batch_signal(self.signal)
        max_requeues = 0 if self.hyperpod else self.max_requeues
        srun = " \\\n    ".join(["srun " + " ".join(self.srun_args()), " ".join(self.torchrun())])
        return f"""#!/bin/bash
{chr(10).join(self.directives())}
# Written by `llmfoundry slurm` ({'HyperPod: srun --auto-resume=1, no self-requeue' if self.hyperpod else
                                  f'self-requeue up to {max_requeues} times'}). A requeue re-runs this script
# with the same resolved recipe; the trainer autoresumes from the newest complete checkpoint in save_folder.
set -u
RECIPE={shlex.quote(str(self.recipe_path))}
SLURM_DIR={shlex.quote(str(self.slurm_dir))}
MAX_REQUEUES={max_requeues}
REQUEUE_CODE={REQUEUE_EXIT_CODE}
# The trainer stops (checkpoint, exit code $REQUEUE_CODE) when this file appears, and rank 0 writes its exit code
# to the other one (torchrun reports any failed worker as 1).
export {FLAG_FILE_ENV}="$SLURM_DIR/preempt-$SLURM_JOB_ID"
export {EXIT_FILE_ENV}="$SLURM_DIR/exit-$SLURM_JOB_ID"
rm -f "${FLAG_FILE_ENV}" "${EXIT_FILE_ENV}"
# Slurm signals this shell ahead of the time limit (or `scancel --batch --signal={name}`); torchrun never sees it.
trap 'echo "llmfoundry: SIG{name} received, asking the trainer to checkpoint and stop"; touch "${FLAG_FILE_ENV}"' {name}
if [ -z "${{SLURM_JOB_END_TIME:-}}" ]; then
    end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null)
    export LLMFOUNDRY_JOB_END_TIME=$(date -d "$end" +%s 2>/dev/null || true)
fi
{self.secret_checks()}HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=$((20000 + SLURM_JOB_ID % 20000))
NTASKS=${{SLURM_NTASKS:-$SLURM_JOB_NUM_NODES}}
echo "llmfoundry: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST, $NTASKS torchrun" \\
     "task(s), rendezvous $HEAD:$PORT"
{srun} &
SRUN_PID=$!
# `wait` returns early when the trap runs; keep waiting until srun itself has ended.
while :; do wait "$SRUN_PID"; kill -0 "$SRUN_PID" 2>/dev/null || break; done
wait "$SRUN_PID"; rc=$?
code=$(cat "${EXIT_FILE_ENV}" 2>/dev/null || true)
rm -f "${FLAG_FILE_ENV}" "${EXIT_FILE_ENV}"
if [ "$rc" -ne 0 ] && [ "$code" = "$REQUEUE_CODE" ]; then
    if [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$MAX_REQUEUES" ]; then
        echo "llmfoundry: checkpoint saved; requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    echo "llmfoundry: checkpoint saved; not requeued (restart ${{SLURM_RESTART_COUNT:-0}} of at most $MAX_REQUEUES)"
fi
exit "$rc"
"""


def write_job(job: SlurmJob, recipe_text: str) -> Path:
    """Write <run folder>/slurm/recipe.yaml and job.sbatch; returns the script's path."""
    job.check()
    job.slurm_dir.mkdir(parents=True, exist_ok=True)
    job.recipe_path.write_text(recipe_text)
    job.script_path.write_text(job.script())
    os.chmod(job.script_path, 0o755)
    return job.script_path
