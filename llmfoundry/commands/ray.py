"""`llmfoundry ray RECIPE.yaml [overrides] --num-workers N`: train on a Ray cluster with Ray Train.

Runs the driver here: it connects to the cluster (--address, else $RAY_ADDRESS, a cluster started on this machine
with `ray start`, or a new local one), and waits for the run. Under ``ray job submit -- llmfoundry ray ...`` it is
the job's entry point. See llmfoundry/launch/ray.py and docs/ray.md.
"""

from __future__ import annotations

import argparse
import sys

from llmfoundry.core.errors import ConfigError
from llmfoundry.launch import ray as ray_launch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmfoundry ray", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="path of the YAML recipe")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--num-workers", type=int, required=True, help="training processes (one per GPU)")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs per worker (default 0: CPUs, gloo)")
    parser.add_argument("--cpus-per-worker", type=float, default=1, help="CPUs per worker (default 1)")
    parser.add_argument("--storage-path",
                        help="Ray's run folders: a folder every node can reach, or s3://bucket/prefix (default: "
                             "Ray's ~/ray_results, enough on one machine)")
    parser.add_argument("--max-failures", type=int, default=0,
                        help="restart the workers this many times after a worker or node fails; training resumes "
                             "from the newest checkpoint (needs save_folder; -1: no limit; default 0)")
    parser.add_argument("--address", help="Ray cluster address, e.g. ray://head:10001 or auto")
    parser.add_argument("--run-name", help="the run's name (default: the recipe's run_name, $RUN_NAME, or a new "
                                           "one); the same name continues the run")
    return parser.parse_intermixed_args(argv)  # overrides may come after the options


def first_failure(error: BaseException) -> tuple[int | None, BaseException]:
    """(rank, exception) of the lowest rank that failed in a Ray ``TrainingFailedError`` (None, the error itself
    for a controller failure). Ray wraps a worker's exception with its traceback text; the original is kept."""
    failures = getattr(error, "worker_failures", None) or {}
    if not failures:
        return None, error
    rank = min(failures)
    return rank, getattr(failures[rank], "_base_exc", failures[rank])


def last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else repr(error)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        from ray.train import TrainingFailedError
    except ImportError:
        print("error: ray: not installed (pip install 'llmfoundry[ray]')", file=sys.stderr)
        return 2
    try:
        result = ray_launch.fit(args.recipe, args.overrides, num_workers=args.num_workers,
                                gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
                                storage_path=args.storage_path, max_failures=args.max_failures,
                                address=args.address, run_name=args.run_name)
    except TrainingFailedError as error:
        rank, cause = first_failure(error)
        if isinstance(cause, ConfigError):  # bad input only a worker could see (a path missing on its node)
            raise ConfigError(f"{cause} (Ray worker of rank {rank})") from None
        print(f"error: the Ray run failed{f' (rank {rank})' if rank is not None else ''}: {last_line(cause)}",
              file=sys.stderr)
        return 1
    print(f"Ray run finished: {result.path}" + (f"; newest checkpoint pointer: {result.checkpoint.path}"
                                                  if result.checkpoint else ""))
    return 0
