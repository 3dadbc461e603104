"""The sections of benchmarks/gpu_check.sh (issue #30): each runs `llmfoundry train` / `plan` / pytest in processes
of their own, each with its own timeout inside one overall budget, and appends its table to the results file as
soon as it is done, so a section that hangs or fails loses only itself.

    python benchmarks/gpu_check.py --results FILE [--cpu-dry-run] [--budget 460]

Sections: the quickstart as shipped; the 125M/350M/1B shapes eager and tuned (benchmarks/mfu.py); the save stall,
synchronous against save_async; resume from an async checkpoint against the uninterrupted run; the CUDA tests
(every test file that uses the ``gpu`` marker); `llmfoundry plan` against the measured peak memory and step time.
With --cpu-dry-run the same pipeline runs at tiny shapes in fp32 on the CPU (for CI: the script works end to end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mfu  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

ROOT = mfu.ROOT


class Check:
    """The run's settings: GPU or dry run, where things go, and the clock every section's timeout is cut to."""

    def __init__(self, args: argparse.Namespace):
        self.dry = args.cpu_dry_run
        self.results = Path(args.results)
        self.work = Path(args.work)
        self.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None  # the device tool brings $OUT back
        self.deadline = time.time() + args.budget
        self.data = Path(args.data)
        self.seq = mfu.CPU_SEQ if self.dry else mfu.GPU_SEQ
        self.precision = "fp32" if self.dry else "amp_bf16"
        self.shapes = ["tiny"] if self.dry else ["1b", "125m", "350m"]  # 1B first: its rows matter most
        self.stall_shape = "tiny" if self.dry else "350m"
        self.gpu_kind = args.gpu_kind
        # the dry run's data is 40 files' worth (prepared by whichever section runs first), a GPU's is packed
        self.extra = ["prepare_data.max_files=40"] if self.dry else []
        self.rows = [r for r in mfu.ROWS if r.shape in self.shapes and r.name in (DRY_ROWS if self.dry else GPU_ROWS)]

    def left(self, want: float, least: float = 15.0) -> float | None:
        """A section's timeout: ``want`` cut to the overall budget; None when under ``least`` seconds are left."""
        return mfu._budget(want, self.deadline, least)

    def append(self, text: str) -> None:
        with self.results.open("a") as f:
            f.write(text.rstrip() + "\n\n")
        if self.out is not None:  # a copy after every section: a lease that ends mid-run still returns the rest
            shutil.copy(self.results, self.out / self.results.name)

    def data_at(self, seq: int) -> str:
        return str(self.data / f"qs{seq}")

    def jsonl(self, name: str) -> Path:
        path = self.work / f"{name}.jsonl"
        path.unlink(missing_ok=True)
        return path


def prepare_data(c: Check, seq: int, timeout: float) -> str | None:
    """The quickstart's data at ``seq`` (one batch of a 1-layer model: prepare_data builds the tokenizer and the
    shards) unless it is there; outside every section's timer. None when ready, else what went wrong."""
    folder = Path(c.data_at(seq))
    if (folder / "train" / "index.json").exists():
        return None
    code, output = mfu.train([f"variables.data_local={folder}", f"variables.max_seq_len={seq}", "eval_first=false",
                              "eval_interval=0", "~icl_tasks", "~eval_gauntlet", "progress_bar=false",
                              "max_duration=1ba", "save_folder=null", "model.n_layers=1",
                              "global_train_batch_size=1", "device_train_microbatch_size=1", *c.extra], timeout)
    return None if code == 0 else f"preparing {folder}: " + ("timeout" if code is None else
                                                             mfu.classify_failure(code, output))


# ----- sections -----
def quickstart(c: Check, timeout: float) -> str:
    jsonl = c.jsonl("quickstart")
    overrides = [f"variables.data_local={c.data_at(128)}", "progress_bar=false", f"save_folder={c.work}/quickstart",
                 f"+loggers.jsonl.path={jsonl}"]
    if c.dry:  # the same run cut short: a few batches, one evaluation with a batch of each ICL task
        overrides += ["max_duration=4ba", "eval_interval=4ba", "eval_first=false", "eval_subset_num_batches=1",
                      "icl_subset_num_batches=1", "save_interval=4ba", "prepare_data.max_files=40"]
    start = time.time()
    code, output = mfu.train(overrides, timeout, c.work / "quickstart.log")
    seconds = time.time() - start
    records = mfu.read_jsonl(jsonl)
    last = {k: v for r in records for k, v in r.items()}  # the newest value of every metric
    status = "ok" if code == 0 else ("timeout" if code is None else mfu.classify_failure(code, output))
    rows = [("exit", status), ("wall seconds (with data prep and evaluation)", f"{seconds:.0f}"),
            ("batches", f"{last.get('time/batch', 0):.0f}"),
            ("loss/train/total (last batch)", _num(last.get("loss/train/total"))),
            ("metrics/eval/LanguageCrossEntropy (last eval)", _num(last.get("metrics/eval/LanguageCrossEntropy")))]
    rows += [(k, _num(v)) for k, v in sorted(last.items()) if k.startswith("icl/") and "gauntlet" in k][:4]
    cmd = "llmfoundry train yamls/quickstart.yaml " + " ".join(overrides[:-1])
    return "## The quickstart as shipped\n\n`" + cmd + "`\n\n" + _table(["what", "value"], rows)


def shapes(c: Check, timeout: float) -> str:
    argv = ["--shapes", *c.shapes, "--rows", *dict.fromkeys(r.name for r in c.rows), "--data", c.data_at(c.seq), "--work", str(c.work / "shapes"),
            "--json", str(c.work / "shapes.json"), "--markdown", str(c.work / "shapes.md"), "--batches",
            "8" if c.dry else "10", "--warmup", "3" if c.dry else "4", "--deadline", str(time.time() + timeout)]
    mfu.main(argv + ["--set", *c.extra])
    return "## Shapes through `llmfoundry train`, eager and tuned (benchmarks/mfu.py)\n\n" + \
        (c.work / "shapes.md").read_text()


def hf(c: Check, timeout: float) -> str:
    shape = "tiny" if c.dry else "125m"
    argv = ["--shapes", shape, "--rows", "eager alibi", "--hf", "--data", c.data_at(c.seq), "--work",
            str(c.work / "hf"), "--markdown", str(c.work / "hf.md"), "--batches", "8" if c.dry else "10",
            "--warmup", "3" if c.dry else "4", "--deadline", str(time.time() + timeout)]
    mfu.main(argv + ["--set", *c.extra])
    return "## Against transformers' MptForCausalLM (ALiBi on both)\n\n" + (c.work / "hf.md").read_text()


def _stall_overrides(c: Check, save_async: bool, jsonl: Path) -> list[str]:
    return (mfu.base_overrides(c.data_at(c.seq), c.seq, c.precision, 12, str(jsonl))
            + mfu.shape_overrides(c.stall_shape)
            + ["device_train_microbatch_size=16", "save_interval=4ba", f"save_async={str(save_async).lower()}",
               f"save_folder={c.work}/stall_{'async' if save_async else 'sync'}", "save_overwrite=true", *c.extra])


def stall_excess(seconds: dict[int, float], saves: list[int], span: int, base: float) -> list[float]:
    """Extra seconds each save cost the batches up to the next save, over ``base`` (a batch with no save near)."""
    return [sum(seconds[b] - base for b in range(s + 1, s + span + 1) if b in seconds) for s in saves]


def stall(c: Check, timeout: float) -> str:
    per_run = timeout / 2
    seconds = {}
    for save_async in (False, True):
        jsonl = c.jsonl(f"stall_{'async' if save_async else 'sync'}")
        code, output = mfu.train(_stall_overrides(c, save_async, jsonl), per_run, jsonl.with_suffix(".log"))
        if code != 0:
            return f"## Save stall\n\nsave_async={save_async}: " + (
                f"timeout after {per_run:.0f} s" if code is None else mfu.classify_failure(code, output))
        seconds[save_async] = mfu.batch_seconds(mfu.read_jsonl(jsonl))
    saves = [4, 8]  # save_interval 4ba over 12 batches: the save at 12 is the final one, after the last batch
    quiet = [t for b, t in seconds[False].items() if b > 2 and b not in (5, 9)]  # no save just before them
    base = statistics.median(quiet)
    sync, asyn = (stall_excess(seconds[m], saves, 4, base) for m in (False, True))
    ratio = statistics.mean(asyn) / statistics.mean(sync) if statistics.mean(sync) > 0 else None
    rows = [("batch with no save near (median, sync run)", f"{base:.3f} s"),
            ("synchronous save: extra seconds (saves at 4, 8)", ", ".join(f"{x:.2f}" for x in sync)),
            ("save_async: extra seconds over the 4 batches after each save", ", ".join(f"{x:.2f}" for x in asyn)),
            ("save_async stall / synchronous stall (acceptance <= 10%)",
             f"{100 * ratio:.0f}%" if ratio is not None else "-"),
            ("per-batch seconds, sync", _series(seconds[False])),
            ("per-batch seconds, async", _series(seconds[True]))]
    return (f"## Save stall: {c.stall_shape}, synchronous vs save_async (saves every 4 batches)\n\n"
            + _table(["what", "value"], rows))


def resume(c: Check, timeout: float) -> str:
    """Resumes the save_async run of the stall section from its ep0-ba8 and compares the losses of batches 9-12."""
    checkpoint = c.work / "stall_async" / "ep0-ba8"
    uninterrupted = {int(r["step"]): r["loss/train/total"] for r in mfu.read_jsonl(c.work / "stall_async.jsonl")}
    if not checkpoint.exists() or not uninterrupted:
        return "## Resume from an async checkpoint\n\nskipped: the stall section left no async checkpoint"
    jsonl = c.jsonl("resumed")
    overrides = [o for o in _stall_overrides(c, True, jsonl) if not o.startswith(("save_folder=", "save_async="))]
    code, output = mfu.train(overrides + ["save_folder=null", f"load_path={checkpoint}"], timeout,
                             jsonl.with_suffix(".log"))
    if code != 0:
        return "## Resume from an async checkpoint\n\n" + (f"timeout after {timeout:.0f} s" if code is None else
                                                              mfu.classify_failure(code, output))
    resumed = {int(r["step"]): r["loss/train/total"] for r in mfu.read_jsonl(jsonl)}
    rows = [(b, _num(uninterrupted.get(b)), _num(resumed.get(b)),
             _num(abs(uninterrupted[b] - resumed[b]) if b in uninterrupted and b in resumed else None))
            for b in sorted(resumed)]
    diffs = [abs(uninterrupted[b] - resumed[b]) for b in resumed if b in uninterrupted]
    same = sum(uninterrupted[b] == resumed[b] for b in resumed if b in uninterrupted)
    verdict = (f"max |difference| {max(diffs):.2e} over {len(diffs)} batches ({same} bitwise equal); "
               f"first batch {min(resumed)}" if diffs else "no batches to compare")
    return ("## Resume from an async checkpoint (stall section's save_async run, from ep0-ba8)\n\n" + verdict + "\n\n"
            + _table(["batch", "uninterrupted loss", "resumed loss", "|difference|"], rows))


def gpu_test_files() -> list[str]:
    """Test files that use the gpu marker (collecting only these keeps unrelated imports out of the check)."""
    marked = re.compile(r"^\s*@pytest\.mark\.gpu\b|^pytestmark\b.*\bmark\.gpu\b", re.MULTILINE)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if marked.search(p.read_text()))


def tests(c: Check, timeout: float) -> str:
    files = gpu_test_files()
    # --timeout (pytest-timeout, packed): one hanging test fails alone instead of taking the section's time
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rfEs", "--timeout",
           str(int(max(10, timeout / 3))), *files]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        output += f"\ntimeout after {timeout:.0f} s"
    (c.work / "tests.log").write_text(output)
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", line)]
    detail = [line[:300] for line in output.splitlines() if line.startswith(("FAILED", "ERROR", "SKIPPED"))][:30]
    if not summary:  # cut short: what it had printed last tells where
        detail += ["(no summary; the output ended with:)"] + [line[:300] for line in output.splitlines()[-12:]]
    return ("## CUDA tests (`pytest -m gpu` over the files that use the marker)\n\n"
            f"`pytest {' '.join(cmd[3:])}`\n\n" + "```\n" + "\n".join(detail + summary[-1:]) + "\n```")


PLAN_LINE = {"peak": re.compile(r"^\s*peak\s+([\d.]+) GiB"),
             "step": re.compile(r"step time\s+([\d.]+) s\s+tok/s per GPU ([\d,]+)\s+MFU ([\d.]+)%")}


def parse_plan(text: str) -> dict:
    """The peak memory (GiB), step time (s), tok/s per GPU and MFU (%) that `llmfoundry plan` printed."""
    out = {}
    for line in text.splitlines():
        if m := PLAN_LINE["peak"].match(line):
            out["peak_gib"] = float(m.group(1))
        if m := PLAN_LINE["step"].search(line):
            out.update(step_s=float(m.group(1)), tok_s=float(m.group(2).replace(",", "")), mfu=float(m.group(3)))
    return out


def plan_estimates(c: Check, rows: list[mfu.Row], timeout: float) -> dict[str, dict]:
    """`llmfoundry plan` for every row, a few at a time (CPU only; started before the GPU sections)."""

    def one(row: mfu.Row) -> tuple[str, dict]:
        overrides = (mfu.base_overrides(c.data_at(c.seq), c.seq, c.precision, 10, "unused.jsonl")
                     + mfu.shape_overrides(row.shape) + row.overrides + c.extra)
        cmd = [sys.executable, "-m", "llmfoundry.cli", "plan", mfu.RECIPE, *overrides, "--nodes", "1",
               "--gpus-per-node", "1", "--gpu", c.gpu_kind, "--no-proposals"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"{row.shape}/{row.name}", dict(status="timeout")
        parsed = parse_plan(proc.stdout)
        status = "ok" if proc.returncode == 0 and parsed else mfu.classify_failure(proc.returncode,
                                                                                  proc.stdout + proc.stderr)
        return f"{row.shape}/{row.name}", dict(parsed, status=status)

    with ThreadPoolExecutor(max_workers=2) as pool:  # 2: the plan processes must not slow the GPU runs' host
        return dict(pool.map(one, rows))


def plan_table(c: Check, estimates: dict[str, dict]) -> str:
    path = c.work / "shapes.json"
    measured = json.loads(path.read_text()) if path.exists() else []
    rows = []
    for m in measured:
        e = estimates.get(f"{m['shape']}/{m['name']}", {"status": "not estimated"})
        peak_gib = m["peak_gb"] * 1e9 / 2**30 if m.get("peak_gb") else None
        rows.append((m["shape"], m["name"], _num(e.get("peak_gib"), ".1f"), _num(peak_gib, ".1f"),
                     _ratio(peak_gib, e.get("peak_gib")), _num(e.get("step_s"), ".4g"), _num(m.get("step_s"), ".4g"),
                     _ratio(m.get("step_s"), e.get("step_s")), _num(e.get("mfu"), ".1f"),
                     _num(m["mfu"] and 100 * m["mfu"], ".1f"), e.get("status", "-") + " / " + m["status"]))
    head = ["shape", "how", "plan peak GiB", "measured peak GiB", "measured/plan", "plan s/step", "measured s/step",
            "measured/plan", "plan MFU %", "measured MFU %", "status (plan / run)"]
    return (f"## `llmfoundry plan ... --nodes 1 --gpus-per-node 1 --gpu {c.gpu_kind}` against the measured runs\n\n"
            "Measured peak: memory_monitor's peak_allocated_mem over the run (converted to GiB); step time: the "
            "median after warm-up.\n\n" + _table(head, rows))


# ----- formatting -----
def _num(value, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _series(seconds: dict[int, float]) -> str:
    return " ".join(f"{b}:{t:.2f}" for b, t in sorted(seconds.items()))


def _table(head: list[str], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x).replace("|", "/") for x in row) + " |" for row in rows]
    return "\n".join(lines)


# mfu.ROWS the check runs per shape: the baseline and the tuned candidates (a row not available is reported so)
GPU_ROWS = ("eager", "compile", "compile mb16", "compile mb16 + fp8")
DRY_ROWS = ("eager", "microbatch 8")

SECTIONS = [  # (name, function, seconds on a GPU, seconds in the dry run), in order of priority
    ("stall", stall, 110, 150),  # two 350M runs of 12 batches; a synchronous save there takes about 7 s
    ("resume", resume, 30, 60),
    ("tests", tests, 90, 90),
    ("shapes", shapes, 230, 90),  # about 35 s a row on an H200 (compiling included)
    ("quickstart", quickstart, 45, 120),
    ("hf", hf, 45, 90),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True)
    p.add_argument("--cpu-dry-run", action="store_true")
    p.add_argument("--budget", type=float, default=460, help="seconds for all sections together")
    p.add_argument("--work", default=str(ROOT / ".gpu" / "work"))
    p.add_argument("--data", default=str(ROOT / ".gpu" / "data"), help="holds qs128 and qs2048 (--pack makes them)")
    p.add_argument("--gpu-kind", default="h100", help="llmfoundry plan's --gpu")
    p.add_argument("--only", nargs="+", default=None, help="run only these sections")
    args = p.parse_args(argv)
    c = Check(args)
    c.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    want_plan = args.only is None or "plan" in args.only
    for seq in sorted({128, c.seq}):  # normally packed (gpu_check.sh --pack); the dry run makes its own
        if (problem := prepare_data(c, seq, 180)) is not None:
            c.append(f"## data\n\n{problem}")
    with ThreadPoolExecutor(max_workers=1) as background:
        planned = background.submit(plan_estimates, c, c.rows, 120) if want_plan else None
        for name, section, gpu_s, dry_s in SECTIONS:
            if args.only is not None and name not in args.only:
                continue
            timeout = c.left(dry_s if c.dry else gpu_s)
            if timeout is None:
                c.append(f"## {name}\n\nskipped: out of the {args.budget:.0f} s budget")
                continue
            start = time.time()
            try:
                text = section(c, timeout)
            except Exception as e:  # a broken section must not lose the others
                text = f"## {name}\n\nfailed: {type(e).__name__}: {e}"
            c.append(text + f"\n\n_{name}: {time.time() - start:.0f} s (timeout {timeout:.0f} s)_")
            print(f"## +{time.time() - t0:.0f}s {name} done", flush=True)
        if planned is not None:
            c.append(plan_table(c, planned.result()))
    print(f"## +{time.time() - t0:.0f}s all sections written to {c.results}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
