"""How long a user waits for the answer to a recipe: the wall time of whole `llmfoundry` processes.

    python benchmarks/recipe_check_latency.py [--repeat 5] [--results benchmarks/results/recipe_check_latency.md]

Cases, each a fresh process started the way a user starts it (`python -m llmfoundry.cli ...`, the same code as the
`llmfoundry` script), timed from start to exit:

- ``typo``: ``llmfoundry train yamls/quickstart.yaml model.n_layer=2`` (exit 2, one line naming the key);
- ``check 125m``: ``llmfoundry check yamls/mpt/125m.yaml``;
- ``check quickstart``: ``llmfoundry check yamls/quickstart.yaml``;
- ``--help``: ``llmfoundry --help``.

The baseline, measured in the same run: ``import torch, transformers``, which every one of these paused on before
the recipe check stopped loading them. The cases run in turn within each repeat (so drift of the machine spreads
over all of them) and the table gives each median, its ratio to the baseline, and the target (<= 1.0 s).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
CASES = {
    "typo": (["train", "yamls/quickstart.yaml", "model.n_layer=2"], 2),
    "check 125m": (["check", "yamls/mpt/125m.yaml"], 0),
    "check quickstart": (["check", "yamls/quickstart.yaml"], 0),
    "--help": (["--help"], 0),
}
BASELINE = "import torch, transformers"


def timed(command: list[str], expected: int) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}, expected {expected}\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--results", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in [*CASES, "baseline"]}
    for _ in range(args.repeat):
        for name, (argv, expected) in CASES.items():
            times[name].append(timed([sys.executable, "-m", "llmfoundry.cli", *argv], expected))
        times["baseline"].append(timed([sys.executable, "-c", BASELINE], 0))
    baseline = statistics.median(times["baseline"])
    rows = ["| case | median s | runs (s) | / baseline | <= 1.0 s |", "|---|---|---|---|---|"]
    for name, values in times.items():
        median = statistics.median(values)
        label = f"baseline: `python -c '{BASELINE}'`" if name == "baseline" else f"`llmfoundry {' '.join(CASES[name][0])}`"
        verdict = "" if name == "baseline" else ("yes" if median <= TARGET_S else "NO")
        rows.append(f"| {label} | {median:.3f} | {' '.join(f'{v:.2f}' for v in values)} | {median / baseline:.2f} "
                    f"| {verdict} |")
    table = "\n".join(rows)
    print(table)
    if args.results:
        args.results.write_text(f"# Recipe check latency\n\n`python {' '.join(sys.argv)}` (median of {args.repeat} "
                                f"runs each)\n\n{table}\n")


if __name__ == "__main__":
    main()
