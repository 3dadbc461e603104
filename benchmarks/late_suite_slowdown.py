"""Do tests late in the suite run slower than alone? (#28: the last 150 tests of a full run within 1.2x.)

    PYTEST_ADDOPTS=--durations=0 bash .ci/run > full.log 2>&1      # or python3 -m pytest --durations=0 > full.log
    python benchmarks/late_suite_slowdown.py full.log [--last 150]

Collects the suite's order, runs its last N tests alone (one pytest process, --durations=0) and prints, for the
same N tests, the sum of their durations in the full run, alone, and the ratio (calls only, and with set-up and
tear-down), then the five tests that grew most. A thread or a process left behind by an earlier test shows here as
a ratio above 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(.+)$", re.M)


def durations(text: str) -> dict[tuple[str, str], float]:
    return {(m[3].strip(), m[2]): float(m[1]) for m in DURATION.finditer(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the output of a full run with --durations=0")
    parser.add_argument("--last", type=int, default=150)
    args = parser.parse_args()
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               cwd=ROOT, capture_output=True, text=True).stdout
    ids = [line for line in collected.splitlines() if "::" in line][-args.last:]
    with tempfile.TemporaryDirectory() as tmp:
        alone_log = Path(tmp) / "alone.log"
        code = f"import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--durations=0', *{ids!r}]))"
        with open(alone_log, "w") as out:
            rc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
        alone = durations(alone_log.read_text())
    if rc != 0:
        sys.exit(f"the last {len(ids)} tests alone did not all pass (pytest exit {rc})")
    full, wanted = durations(args.log.read_text()), set(ids)
    for phases in (("call",), ("setup", "call", "teardown")):
        in_full = sum(v for (name, phase), v in full.items() if name in wanted and phase in phases)
        by_itself = sum(v for (name, phase), v in alone.items() if name in wanted and phase in phases)
        print(f"last {len(ids)} tests, {'+'.join(phases)}: full run {in_full:.1f} s, alone {by_itself:.1f} s, "
              f"ratio {in_full / by_itself:.2f}")
    grown = sorted(((full.get((n, "call"), 0.0) - alone.get((n, "call"), 0.0), n) for n in ids), reverse=True)[:5]
    for delta, name in grown:
        print(f"  {delta:+.2f} s  {name}")


if __name__ == "__main__":
    main()
