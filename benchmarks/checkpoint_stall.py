"""How long a checkpoint save blocks the training loop: save_async against synchronous saves of the same state.

    python benchmarks/checkpoint_stall.py [--repeat 3] [--nproc 1 2] [--shape python-bound|wide] [--cases ...]
                                          [--results benchmarks/results/checkpoint_stall.md]

Each repeat launches one job per process count and case (2 ranks: torchrun, gloo, FSDP FULL_SHARD; 1: a plain
process), in which the real Trainer trains the same recipe; the four cases are: synchronous and save_async saves to
a local save_folder and to an s3:// save_folder on a moto server on 127.0.0.1 (the cases' order rotates from one
repeat to the next, so drift of the machine does not favour one). A case's stall is the median over its saves of
the time the loop lost to the save: the wall time of ``Trainer.save`` (which also waits for the previous
background write, if still running), plus, with save_async, the time the next optimizer step waited for the copy
of the parameters and optimizer state to host memory, plus what the steps run while the write (or an upload) was
in flight took beyond the median step without one. The table gives the median over repeats and the ratio
stall(async) / stall(sync) of the same destination, whose target is <= 0.10. The default shape, python-bound, is
a step bound by Python launching many small ops, as on a GPU (issue #30).

Contention: a background write shares the CPU with training. ``step busy`` / ``step idle`` are the median step
times of the async run with and without a background write or upload in flight, and ``slowdown`` their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = ("sync local", "async local", "sync s3", "async s3")
# python-bound: a tiny, deep model of many small ops, whose step is bound by Python launching ops, as a training
# loop on a GPU is (issue #30: there a writer thread in the training process made the steps after a save 30-80% of
# a synchronous save slower); wide: fewer, larger ops, whose step is bound by the CPU's arithmetic.
SHAPES = {
    "python-bound": {"d_model": 64, "n_heads": 4, "n_layers": 24, "expansion_ratio": 2, "warmup": 10, "saves": 3,
                     "interval": 40},
    "wide": {"d_model": 512, "n_heads": 8, "n_layers": 4, "expansion_ratio": 4, "warmup": 2, "saves": 3,
             "interval": 5},
}
BUCKET = "stall"
TARGET = 0.10


# ----------------------------------------------------------------------------------------------- worker
def run_cases(spec: dict) -> dict:
    """In a (torchrun) process: train the recipe once per case, timing every save and step."""
    from llmfoundry.core import dist
    from tests.helpers import make_trainer, tiny_recipe

    results = {}
    for case in spec["cases"]:
        mode, where = case.split()
        folder = (f"s3://{BUCKET}/{spec['tag']}/{mode}" if where == "s3" else str(Path(spec["work"]) / spec["tag"] /
                                                                                 mode))
        recipe = tiny_recipe(
            Path(spec["mds"]), Path(spec["tokenizer"]), eval_loader=None, python_log_level=None,
            model={"name": "mpt_causal_lm", "d_model": spec["d_model"], "n_heads": spec["n_heads"],
                   "n_layers": spec["n_layers"], "expansion_ratio": spec["expansion_ratio"], "max_seq_len": 64,
                   "vocab_size": 512,
                   "attn_config": {"attn_impl": "torch", "alibi": True}, "learned_pos_emb": False},
            global_train_batch_size=spec["nproc"], device_train_microbatch_size=1, precision="fp32",
            max_duration=f"{spec['warmup'] + spec['saves'] * spec['interval']}ba",
            save_interval=f"{spec['interval']}ba", save_folder=folder, save_async=mode == "async",
            checkpoint_upload={"staging_folder": str(Path(spec["work"]) / spec["tag"] / f"staging-{mode}")},
            fsdp_config={"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"} if spec["nproc"] > 1 else None)
        trainer = make_trainer(recipe)
        saves, waits, steps, previous = [], [], [], []
        save, train_step, wait = trainer.save, trainer.train_step, trainer.checkpointer.wait

        def timed_wait():  # a save first waits for the write before it (save_async)
            start = time.perf_counter()
            wait()
            if len(previous) == len(saves):  # the first wait of the save under way
                previous.append(time.perf_counter() - start)

        def timed_save():
            start = time.perf_counter()
            path = save()
            if len(previous) == len(saves):  # a synchronous save waits for nothing
                previous.append(0.0)
            saves.append(time.perf_counter() - start)
            waits.append(0.0)
            return path

        def timed_step(batch):
            busy = background_busy(trainer)
            blocked = blocked_s(trainer)
            start = time.perf_counter()
            metrics = train_step(batch)
            steps.append((time.perf_counter() - start, busy or background_busy(trainer), len(saves) - 1))
            if saves and blocked_s(trainer) > blocked:  # the optimizer step waited for the save's copy: a stall
                waits[-1] += blocked_s(trainer) - blocked
            return metrics

        trainer.save, trainer.train_step, trainer.checkpointer.wait = timed_save, timed_step, timed_wait
        trainer.fit()
        state_mb = state_bytes(trainer) / 2**20
        steps = steps[spec["warmup"]:]  # the first steps include one-time start-up work
        idle = median_or_none([t for t, b, _ in steps if not b])
        # what the steps run while a write or upload was in flight lost to it, charged to the save before them:
        # their number times how much their median exceeds the median step without one (medians: one step slowed
        # by the machine's other work is not charged to the save, and a sum of positive parts would add the noise)
        slower = []
        for i in range(len(saves)):
            busy_steps = [t for t, b, k in steps if b and k == i]
            slower.append(max(0.0, len(busy_steps) * (statistics.median(busy_steps) - idle))
                          if busy_steps and idle else 0.0)
        stalls = [s + w + x for s, w, x in zip(saves, waits, slower)]
        results[case] = {
            "stall_s": statistics.median(stalls), "first_save_s": stalls[0],
            "step_wait_s": statistics.median(waits), "slower_s": statistics.median(slower), "saves": len(saves),
            "previous_s": statistics.median(previous) if previous else 0.0,
            "busy_steps": [sum(1 for _, b, k in steps if b and k == i) for i in range(len(saves))],
            "per_save": [[round(x, 3) for x in row] for row in zip(saves, waits, slower)],
            "step_busy_s": median_or_none([t for t, b, _ in steps if b]), "step_idle_s": idle,
            "state_mb": dist_sum(state_mb),
        }
        trainer = None  # only one case's model and optimizer alive at a time
    dist.barrier()
    return results


def background_busy(trainer) -> bool:
    """A background write (save_async) or an upload (s3://: by the uploader thread of a synchronous save, by the
    writer process with save_async, asked at each step) is in flight on this rank."""
    checkpointer, background = trainer.checkpointer, trainer.checkpointer.background
    if background is not None:
        return background.busy() or (checkpointer.remote and background.upload_status()["pending"] > 0)
    return checkpointer.uploader is not None and checkpointer.uploader.pending() > 0


def blocked_s(trainer) -> float:
    """How long optimizer steps have waited for a save_async copy (train.async_save)."""
    background = trainer.checkpointer.background
    return background.blocked_s if background is not None else 0.0


def state_bytes(trainer) -> int:
    """Bytes of this rank's model and optimizer state (what a checkpoint holds)."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    tensors = [local(p) for p in trainer.model.parameters()]
    tensors += [local(v) for state in trainer.optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def dist_sum(value: float) -> float:
    import torch

    from llmfoundry.core import dist

    return float(dist.all_reduce_sum(torch.tensor(value, dtype=torch.float64)))


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def worker_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    results = run_cases(spec)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(spec["out"]).write_text(json.dumps(results))


# ----------------------------------------------------------------------------------------------- orchestration
class StoreProcess:
    """moto's S3 server in a process of its own at nice 19, on 127.0.0.1. A real store is another machine: run in
    this process (a thread, as the tests run it), its work for each upload took the 2 cores from the training loop
    and was charged to the save as slower steps, whether the upload ran in the training process or not."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import os, sys; os.nice(19); from moto.server import main; main(sys.argv[1:])",
             "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def make_world(work: Path):
    import boto3

    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer
    from tests.helpers import TINY_RECIPE_SEQ, convert_text_folder, make_corpus, write_text_folder

    corpus = make_corpus(400)
    tokenizer = work / "tokenizer"
    train_bpe_tokenizer(corpus, vocab_size=512, out_dir=tokenizer)
    mds = work / "mds"
    convert_text_folder(write_text_folder(work / "text", corpus), mds / "train", tokenizer, TINY_RECIPE_SEQ)
    s3 = StoreProcess()
    env = {"AWS_ACCESS_KEY_ID": "stall", "AWS_SECRET_ACCESS_KEY": "stall", "AWS_DEFAULT_REGION": "us-east-1",
           "S3_ENDPOINT_URL": s3.url, "AWS_ENDPOINT_URL_S3": s3.url}
    boto3.client("s3", endpoint_url=s3.url, aws_access_key_id="stall", aws_secret_access_key="stall",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return mds, tokenizer, s3, env


def run_job(args, work: Path, mds: Path, tokenizer: Path, env: dict, nproc: int, repeat: int) -> dict:
    """The cases of one repeat, each in a job of its own (streaming's shared memory of one run's loaders is not
    always released in time for the next run's in the same process)."""
    cases = [c for c in CASES if c in args.cases]
    shift = repeat % len(cases)
    results = {}
    for case in cases[shift:] + cases[:shift]:
        results.update(run_case(args, work, mds, tokenizer, env, nproc, repeat, case))
    return results


def run_case(args, work: Path, mds: Path, tokenizer: Path, env: dict, nproc: int, repeat: int, case: str) -> dict:
    from tests.distributed.helpers import torchrun_args, worker_env

    tag = f"n{nproc}-r{repeat}-{case.replace(' ', '-')}"
    spec = {"cases": [case], "work": str(work), "mds": str(mds),
            "tokenizer": str(tokenizer), "tag": tag, "nproc": nproc, **SHAPES[args.shape],
            "out": str(work / f"{tag}.json")}
    spec_path = work / f"{tag}-spec.json"
    spec_path.write_text(json.dumps(spec))
    entry = [*torchrun_args(nproc)] if nproc > 1 else [sys.executable]
    log = work / f"{tag}.log"
    with open(log, "w") as out:
        rc = subprocess.run([*entry, str(Path(__file__).resolve()), "--worker", str(spec_path)], cwd=work,
                            env={**worker_env(), **env, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
                                 "TOKENIZERS_PARALLELISM": "false"}, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        lines = log.read_text().splitlines()
        errors = [line for line in lines if "Error" in line or "error:" in line]
        raise SystemExit(f"job {tag} failed ({rc}):\n" + "\n".join(errors[:20] + lines[-40:]))
    return json.loads(Path(spec["out"]).read_text())


def fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if unit == "s" else f"{value:.2f}"


def table(runs: dict[int, list[dict]], cases: list[str]) -> tuple[str, bool]:
    """The markdown table (medians over repeats) and whether every ratio meets the target."""
    lines = ["| ranks | case | state (MB) | stall (median of runs) | per run (ms) | of which next step waited | "
             "of which steps ran slower | of which save waited for the previous write | ratio async/sync | step idle | step busy | slowdown |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ok = True
    for nproc, repeats in runs.items():
        med = {case: statistics.median(r[case]["stall_s"] for r in repeats) for case in cases}
        for case in cases:
            per_run = ", ".join(f"{r[case]['stall_s'] * 1000:.0f}" for r in repeats)
            ratio = ratio_text = "-"
            if case.startswith("async") and case.replace("async", "sync") in med:
                ratio = med[case] / med[case.replace("async", "sync")]
                ok = ok and ratio <= TARGET
                ratio_text = f"**{ratio:.3f}**" + ("" if ratio <= TARGET else " (over target)")
            idle = median_or_none([r[case]["step_idle_s"] for r in repeats if r[case]["step_idle_s"] is not None])
            busy = median_or_none([r[case]["step_busy_s"] for r in repeats if r[case]["step_busy_s"] is not None])
            slowdown = f"{busy / idle:.2f}x" if busy and idle else "-"
            waited = statistics.median(r[case]["step_wait_s"] for r in repeats)
            slower = statistics.median(r[case]["slower_s"] for r in repeats)
            previous = statistics.median(r[case]["previous_s"] for r in repeats)
            lines.append(f"| {nproc} | {case} | {repeats[0][case]['state_mb']:.1f} | {fmt(med[case])} | {per_run} | "
                         f"{fmt(waited)} | {fmt(slower)} | {fmt(previous)} | {ratio_text} | {fmt(idle)} | {fmt(busy)} | {slowdown} |")
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="python-bound",
                        help="the model and schedule (SHAPES: model size, warm-up steps, saves, steps between saves)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--results", help="also write the command and table to this markdown file")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return 0
    with tempfile.TemporaryDirectory(prefix="checkpoint-stall-") as tmp:
        work = Path(tmp)
        mds, tokenizer, s3, env = make_world(work)
        runs: dict[int, list[dict]] = {n: [] for n in args.nproc}
        try:
            for repeat in range(args.repeat):
                for nproc in args.nproc:
                    runs[nproc].append(run_job(args, work, mds, tokenizer, env, nproc, repeat))
                    print(f"repeat {repeat + 1}/{args.repeat}, {nproc} rank(s): " + ", ".join(
                        f"{c} {v['stall_s'] * 1000:.0f} ms (per save: save, step waited, slower: {v['per_save']}; "
                        f"steps with a write in flight: {v['busy_steps']})" for c, v in runs[nproc][-1].items()),
                          flush=True)
        finally:
            s3.stop()
    text, ok = table(runs, [c for c in CASES if c in args.cases])
    command = "python benchmarks/checkpoint_stall.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"\n{command}\n\n{text}\n\ntarget: stall(async) / stall(sync) <= {TARGET}: {'met' if ok else 'NOT met'}")
    if args.results:
        Path(args.results).write_text(f"# Checkpoint stall: save_async against synchronous saves\n\n```\n"
                                      f"{command.strip()}\n```\n\n{text}\n\ntarget <= {TARGET}: "
                                      f"{'met' if ok else 'NOT met'}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
