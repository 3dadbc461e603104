"""How long `llmfoundry plan yamls/mpt/70b.yaml --nodes 64 --gpus-per-node 8` takes, start to end, as a user runs it
(a fresh process each time: imports, recipe, meta model, the fake-tensor runs, proposals). Median of 3 against
the 30 s target of issue #32.

    python benchmarks/plan_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "llmfoundry.cli", "plan", "yamls/mpt/70b.yaml", "--nodes", "64", "--gpus-per-node", "8"]
TARGET_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(COMMAND, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    load = os.getloadavg()[0]
    print(f"llmfoundry plan yamls/mpt/70b.yaml --nodes 64 --gpus-per-node 8: median {median:.1f} s of "
          f"{', '.join(f'{t:.1f}' for t in times)} (target {TARGET_S:.0f} s: {median / TARGET_S:.2f}x of it; "
          f"{os.cpu_count()} CPUs, load average {load:.1f})")


if __name__ == "__main__":
    main()
