"""Fault injection: what a 2-rank FSDP training run on CPU (torchrun, gloo) survives, against an uninterrupted run.

    python benchmarks/chaos.py [--kills 20] [--only NAME ...] [--results benchmarks/results/chaos_cpu.md]

Every faulted run is followed by what a user (or a scheduler) does next -- run the same command again, with
``autoresume`` -- and is then compared with the reference run of the same recipe: final weights bitwise, the
checkpoints complete before the fault still complete afterwards, and every global batch trained on exactly the
reference's samples (the ``record_samples`` callback hashes each row; a batch that was redone after a resume counts
once, from the run whose update survived). The table printed at the end has one row per fault.

How the moments are chosen (a seeded random generator, ``--seed``):
* ``kill`` rows SIGKILL all processes of the job (torchrun and both ranks) or one rank alone (torchrun then stops
  the other), at a random moment of the kind the row names: ``random`` = after a random step, plus a random
  fraction of a step; ``checkpoint write`` = as soon as the temporary folder of a randomly chosen checkpoint
  (``.ep0-baN.partial``) appears, plus 0-40 ms: inside DCP's writes; ``upload`` = with save_folder on the moto S3
  server behind a proxy that slows requests, once a randomly chosen checkpoint has some objects in the bucket but
  no ``.complete`` marker. The note column says how many kills landed where they were aimed.
* ``s3 down`` rows take the S3 endpoint away (connections refused, open ones cut) while a checkpoint is uploading.
* ``disk full`` puts save_folder on a tmpfs (needs root) sized for two checkpoints; the run is resumed after
  growing it (``mount -o remount,size=...``), as a person who freed space would.
* ``damaged`` rows truncate or flip a bit in an MDS shard or a checkpoint shard before a run reads it.
* ``nan`` rows make one batch's loss NaN (a forward hook) under loss_spike_guard's three actions.
* ``rank dies in a collective`` kills rank 1 while rank 0 waits for it in the next step's collectives.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import boto3  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from tests.conftest import MotoS3Server  # noqa: E402
from tests.dist.helpers import WORKER, descendants, kill_tree, torchrun_args, worker_env  # noqa: E402
from tests.helpers import TINY_RECIPE_SEQ, convert_text_folder, make_corpus, tiny_recipe, write_text_folder  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402

BATCHES = 12
SAVE_EVERY = 2
BUCKET = "chaos"
FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
# code_paths file for the faults that act from inside the run (armed by environment variables)
FAULT_CALLBACKS = '''
import os, time, torch
from dataclasses import dataclass
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback

@dataclass
class Nothing:
    pass

class Faults(Callback):
    def __init__(self):
        self.nan_at = int(os.environ.get("CHAOS_NAN_AT", "0"))
        self.stall_at = int(os.environ.get("CHAOS_STALL_AT", "0"))
        self.hook = None

    def on_batch_start(self, trainer):
        batch = trainer.time.batch + 1
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if batch == self.nan_at:
            self.hook = trainer.model.get_input_embeddings().register_forward_hook(lambda m, i, out: out * torch.nan)
        if batch == self.stall_at and trainer.dist.rank == 1:
            open(os.environ["CHAOS_STALL_FLAG"], "w").close()
            time.sleep(30)

callbacks.register("chaos_faults", config=Nothing)(lambda s: Faults())
'''


# ----------------------------------------------------------------------------------------------- set-up
@dataclass
class World:
    work: Path
    mds: Path
    tokenizer: Path
    s3: MotoS3Server
    proxy: TcpProxy
    faults_file: Path
    reference: dict = field(default_factory=dict)  # "weights", "batches"

    def env(self, proxied: bool = False) -> dict[str, str]:
        endpoint = self.proxy.url if proxied else self.s3.url
        return {**worker_env(), "AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos",
                "AWS_DEFAULT_REGION": "us-east-1", "S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}


def make_world(work: Path) -> World:
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer

    corpus = make_corpus(400)
    tokenizer = work / "tokenizer"
    train_bpe_tokenizer(corpus, vocab_size=512, out_dir=tokenizer)
    mds = work / "mds"
    convert_text_folder(write_text_folder(work / "text", corpus), mds / "train", tokenizer, TINY_RECIPE_SEQ)
    s3 = MotoS3Server()
    s3.start()
    boto3.client("s3", endpoint_url=s3.url, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    faults = work / "chaos_faults.py"
    faults.write_text(FAULT_CALLBACKS)
    return World(work, mds, tokenizer, s3, TcpProxy("127.0.0.1", s3.port).up(), faults)


def recipe(world: World, name: str, save_folder: str, **extra) -> dict:
    r = tiny_recipe(world.mds, world.tokenizer, eval_loader=None, max_duration=f"{BATCHES}ba", python_log_level=None,
                    save_interval=f"{SAVE_EVERY}ba", save_folder=save_folder, autoresume=True, run_name=name,
                    fsdp_config=FSDP, code_paths=[str(world.faults_file)],
                    callbacks={"record_samples": {"folder": "SAMPLES"}, "chaos_faults": {}},
                    checkpoint_upload={"staging_folder": str(world.work / name / "staging"), "max_backoff_s": 1.0})
    r.update(extra)
    return r


@dataclass
class Job:
    """One attempt of a run: its process, folder and log."""

    proc: subprocess.Popen
    folder: Path
    log: Path

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            return -9

    def steps(self) -> int:
        path = self.folder / "metrics.jsonl"
        if not path.exists():
            return 0
        steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.endswith("}")]
        return max(steps, default=0)

    def last_line(self) -> str:
        lines = [line for line in self.log.read_text().splitlines() if line.strip()]
        return next((line for line in reversed(lines) if line.startswith("error:") or "training stopped" in line),
                    lines[-1] if lines else "")


def launch(world: World, run: dict, run_dir: Path, attempt: int, env: dict | None = None) -> Job:
    folder = run_dir / f"attempt{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    run = json.loads(json.dumps(run).replace("SAMPLES", str(folder)))
    run["loggers"] = {"jsonl": {"path": str(folder / "metrics.jsonl")}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    log = folder / "log.txt"
    proc = subprocess.Popen([*torchrun_args(2), str(WORKER), str(path)], cwd=folder, env=env or world.env(),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return Job(proc, folder, log)


def run_to_end(world: World, run: dict, run_dir: Path, attempt: int, env=None) -> Job:
    job = launch(world, run, run_dir, attempt, env)
    job.wait()
    return job


# ----------------------------------------------------------------------------------------------- reading results
def effective_batches(run_dir: Path) -> dict[int, list[str]]:
    """batch -> sample hashes of the attempt whose update of that batch survived (the last one that ran it)."""
    batches: dict[int, dict[int, list[str]]] = {}
    for attempt in sorted(run_dir.glob("attempt*"), key=lambda p: int(p.name[7:])):
        for path in attempt.glob("samples-*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    row = json.loads(line)
                    batches.setdefault(row["batch"], {})[row["rank"]] = row["rows"]
    return {b: [h for r in sorted(ranks) for h in ranks[r]] for b, ranks in batches.items()}


def sample_errors(world: World, run_dir: Path) -> tuple[int, int]:
    """(lost, repeated) samples of a run's effective batches against the reference's."""
    got = effective_batches(run_dir)
    want = world.reference["batches"]
    lost = repeated = 0
    for batch in set(want) | set(got):
        expected, seen = collections.Counter(want.get(batch, [])), collections.Counter(got.get(batch, []))
        lost += sum((expected - seen).values())
        repeated += sum((seen - expected).values())
    return lost, repeated


def local_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "weights.pt"
        dcp_to_torch_save(str(checkpoint), str(out))
        return torch.load(out, weights_only=True)["model"]


def s3_client(world: World):
    return boto3.client("s3", endpoint_url=world.s3.url, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                        region_name="us-east-1")


def s3_keys(world: World, prefix: str) -> list[str]:
    pages = s3_client(world).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def complete_checkpoints(world: World, save_folder: str) -> set[str]:
    if save_folder.startswith("s3://"):
        prefix = save_folder.split("/", 3)[3] + "/"
        return {k[len(prefix):].split("/")[0] for k in s3_keys(world, prefix) if k.endswith("/.complete")}
    return {p.name for p in Path(save_folder).glob("ep*-ba*") if (p / ".metadata").exists()}


def final_weights(world: World, save_folder: str) -> dict[str, torch.Tensor] | None:
    name = f"ep0-ba{BATCHES}"
    if save_folder.startswith("s3://"):
        prefix = f"{save_folder.split('/', 3)[3]}/{name}/"
        if f"{prefix}.complete" not in s3_keys(world, prefix):
            return None
        target = Path(tempfile.mkdtemp(dir=world.work)) / name
        for key in s3_keys(world, prefix):
            dest = target / key[len(prefix):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3_client(world).download_file(BUCKET, key, str(dest))
        return local_weights(target)
    folder = Path(save_folder) / name
    return local_weights(folder) if (folder / ".metadata").exists() else None


def bitwise_equal(world: World, weights: dict | None) -> bool:
    ref = world.reference["weights"]
    return weights is not None and ref.keys() == weights.keys() and all(torch.equal(ref[k], weights[k]) for k in ref)


@dataclass
class Row:
    fault: str
    trials: int = 0
    survived: int = 0
    bitwise: int = 0
    lost_checkpoints: int = 0
    lost_samples: int = 0
    repeated_samples: int = 0
    notes: list[str] = field(default_factory=list)
    compared: bool = False  # whether runs were compared with the reference (the nan and damaged-data rows are not)

    def add(self, world: World, run_dir: Path, save_folder: str, survived: bool, lost_checkpoints: int = 0,
            note: str | None = None) -> None:
        self.trials += 1
        self.compared = True
        same = bitwise_equal(world, final_weights(world, save_folder))
        lost, repeated = sample_errors(world, run_dir)
        self.survived += int(survived and same)
        self.bitwise += int(same)
        self.lost_checkpoints += lost_checkpoints
        self.lost_samples += lost
        self.repeated_samples += repeated
        if note:
            self.notes.append(note)
        print(f"  {self.fault} #{self.trials}: survived={survived} bitwise={same} lost_ckpt={lost_checkpoints} "
              f"lost={lost} repeated={repeated} {note or ''}", flush=True)


# ----------------------------------------------------------------------------------------------- faults
def wait_for(predicate, job: Job, timeout: float = 300, poll: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if job.proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def kill(job: Job, target: str, rng: random.Random) -> None:
    if target == "all":
        kill_tree(job.proc)
        return
    ranks = [pid for pid in descendants(job.proc.pid) if "LOCAL_RANK=1" in _environ(pid)]
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_row_name(moment: str, target: str) -> str:
    where = {"random": "at a random moment", "checkpoint write": "inside a checkpoint write",
             "upload": "during a checkpoint upload"}[moment]
    return f"SIGKILL {'all ranks' if target == 'all' else 'one rank'} {where}"


def kill_trial(world: World, row: Row, moment: str, target: str, trial: int, rng: random.Random) -> None:
    name = f"kill-{moment.replace(' ', '-')}-{target}-{trial}"
    run_dir = world.work / name
    remote = moment == "upload"
    save_folder = f"s3://{BUCKET}/{name}" if remote else str(run_dir / "ckpt")
    run = recipe(world, name, save_folder)
    world.proxy.delay_s = 0.01 if remote else 0.0
    job = launch(world, run, run_dir, 1, world.env(proxied=remote))
    aimed = False
    if moment == "random":
        step = rng.randint(1, BATCHES - 1)
        wait_for(lambda: job.steps() >= step, job)
        time.sleep(rng.uniform(0, 0.5))
        aimed = job.proc.poll() is None
    elif moment == "checkpoint write":
        batch = SAVE_EVERY * rng.randint(1, BATCHES // SAVE_EVERY - 1)
        partial = Path(save_folder) / f".ep0-ba{batch}.partial"
        wait_for(partial.exists, job)
        time.sleep(rng.uniform(0, 0.04))
        aimed = partial.exists()
    else:
        batch = SAVE_EVERY * rng.randint(1, BATCHES // SAVE_EVERY - 1)
        prefix = f"{name}/ep0-ba{batch}/"

        def uploading() -> bool:
            keys = s3_keys(world, prefix)
            return bool(keys) and f"{prefix}.complete" not in keys

        aimed = wait_for(uploading, job, poll=0.02)
    before = complete_checkpoints(world, save_folder)
    kill(job, target, rng)
    job.wait(120)
    world.proxy.delay_s = 0.0
    attempt = 2
    while True:  # what a scheduler does: run again until the run ends (a kill of one rank may leave the other)
        job = run_to_end(world, run, run_dir, attempt, world.env(proxied=remote))
        if job.proc.returncode == 0 or attempt >= 4:
            break
        attempt += 1
    after = complete_checkpoints(world, save_folder)
    row.add(world, run_dir, save_folder, job.proc.returncode == 0, len(before - after),
            "the kill landed where aimed" if aimed else "missed its moment")


def s3_outage(world: World, row: Row, seconds: float, budget_s: float | None) -> None:
    name = f"s3-down-{int(seconds)}s" + ("-over-budget" if budget_s else "")
    run_dir = world.work / name
    save_folder = f"s3://{BUCKET}/{name}"
    run = recipe(world, name, save_folder)
    if budget_s:
        run["checkpoint_upload"]["timeout_s"] = budget_s
    world.proxy.delay_s = 0.01
    job = launch(world, run, run_dir, 1, world.env(proxied=True))
    prefix = f"{name}/ep0-ba4/"
    wait_for(lambda: bool(s3_keys(world, prefix)), job, poll=0.02)
    world.proxy.down()
    steps_at_down = job.steps()
    bad_latest = 0
    down_until = time.monotonic() + seconds
    while time.monotonic() < down_until:  # the bucket itself is watched directly, not through the proxy
        bad_latest += _latest_is_incomplete(world, name)
        time.sleep(0.5)
    steps_in_outage = job.steps() - steps_at_down
    world.proxy.delay_s = 0.0
    world.proxy.up()
    while job.proc.poll() is None:
        bad_latest += _latest_is_incomplete(world, name)
        time.sleep(0.5)
    first = job.proc.returncode
    message = job.last_line()
    if budget_s:  # expected: a one-line error, then the same command again resumes
        ok = first != 0 and message.startswith("training stopped: save_folder: checkpoint upload")
        job = run_to_end(world, run, run_dir, 2, world.env(proxied=True))
        ok = ok and job.proc.returncode == 0
        note = f"`{message[:130]}`; then resumed"
    else:
        ok = first == 0
        note = f"{steps_in_outage} batches trained while the store was down"
    expected = {f"ep0-ba{b}" for b in range(SAVE_EVERY, BATCHES + 1, SAVE_EVERY)}
    lost = len(expected - complete_checkpoints(world, save_folder)) if not budget_s else 0
    row.add(world, run_dir, save_folder, ok and bad_latest == 0, lost,
            note + (f"; latest named an incomplete checkpoint {bad_latest}x" if bad_latest else ""))


def _latest_is_incomplete(world: World, name: str) -> int:
    try:
        latest = s3_client(world).get_object(Bucket=BUCKET, Key=f"{name}/latest")["Body"].read().decode().strip()
    except Exception:  # noqa: BLE001 - not written yet
        return 0
    return int(f"{name}/{latest}/.complete" not in s3_keys(world, f"{name}/{latest}/"))


def disk_full(world: World, row: Row) -> None:
    name = "disk-full"
    run_dir = world.work / name
    mount = run_dir / "ckpt"
    mount.mkdir(parents=True)
    reference_checkpoint = world.work / "reference" / "ckpt" / f"ep0-ba{SAVE_EVERY}"
    size = sum(p.stat().st_size for p in reference_checkpoint.rglob("*") if p.is_file())
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size * 2.5)}", "tmpfs", str(mount)]).returncode:
        row.notes.append("not run: mounting a tmpfs needs root")
        return
    try:
        run = recipe(world, name, str(mount))
        job = run_to_end(world, run, run_dir, 1)
        first, message = job.proc.returncode, job.last_line()
        intact = complete_checkpoints(world, str(mount))
        partial = [p.name for p in mount.iterdir() if p.name.endswith(".partial")]
        subprocess.run(["mount", "-o", f"remount,size={int(size * 10)}", str(mount)], check=True)
        job = run_to_end(world, run, run_dir, 2)
        ok = first != 0 and message.startswith("error: save_folder: could not write checkpoint") and not partial
        row.add(world, run_dir, str(mount), ok and job.proc.returncode == 0,
                len(intact - complete_checkpoints(world, str(mount))),
                f"`{message[:150]}`; {len(intact)} complete checkpoints kept")
    finally:
        subprocess.run(["umount", str(mount)])


def damaged_data(world: World, row: Row, damage: str) -> None:
    name = f"mds-{damage}"
    run_dir = world.work / name
    data = run_dir / "mds"
    shutil.copytree(world.mds, data)
    shard = sorted((data / "train").rglob("shard.*.mds"))[1]
    raw = bytearray(shard.read_bytes())
    if damage == "truncated":
        shard.write_bytes(bytes(raw[: len(raw) - 100]))
    else:
        raw[-5] ^= 0x04
        shard.write_bytes(bytes(raw))
    run = recipe(world, name, str(run_dir / "ckpt"))
    run["train_loader"]["dataset"]["local"] = str(data)
    if damage == "bit-flipped":
        run["train_loader"]["dataset"]["validate_hash"] = "xxh64"
    job = run_to_end(world, run, run_dir, 1)
    message = job.last_line()
    ok = job.proc.returncode != 0 and str(shard) in message and message.startswith("error:")
    row.trials += 1
    row.survived += int(ok)
    row.notes.append(f"`{message[:150]}`")
    print(f"  {row.fault}: {ok} {message}", flush=True)


def damaged_checkpoint(world: World, row: Row, damage: str) -> None:
    name = f"ckpt-{damage}"
    run_dir = world.work / name
    save_folder = run_dir / "ckpt"
    run = recipe(world, name, str(save_folder))
    job = launch(world, run, run_dir, 1)  # stopped (SIGKILL) once ep0-ba6 is complete: the schedule stays the same
    wait_for(lambda: (save_folder / "ep0-ba6" / ".metadata").exists(), job, poll=0.01)
    kill_tree(job.proc)
    newest = save_folder / (save_folder / "latest").read_text().strip()
    shard = newest / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    if damage == "truncated":
        shard.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        raw[len(raw) // 3] ^= 0x01
        shard.write_bytes(bytes(raw))
    job = run_to_end(world, run, run_dir, 2)
    message = job.last_line()
    refused = job.proc.returncode != 0 and message.startswith("error: load_path:") and str(shard) in message
    shutil.rmtree(newest)  # what the message tells a person to do
    job = run_to_end(world, run, run_dir, 3)
    row.add(world, run_dir, str(save_folder), refused and job.proc.returncode == 0, 0,
            f"refused: `{message[:150]}`; resumed from the previous checkpoint after deleting {newest.name}")


def nan_loss(world: World, row: Row, action: str, skip_weights: dict) -> None:
    name = f"nan-{action}"
    run_dir = world.work / name
    save_folder = run_dir / "ckpt"
    run = recipe(world, name, str(save_folder))
    run["callbacks"]["loss_spike_guard"] = {"action": action}
    env = dict(world.env(), CHAOS_NAN_AT="5")
    job = run_to_end(world, run, run_dir, 1, env)
    message = job.last_line()
    row.trials += 1
    if action == "skip":
        ok = job.proc.returncode == 0
        skip_weights.update(final_weights(world, str(save_folder)) or {})
        note = "batch 5's update skipped, the run went on"
    elif action == "checkpoint":
        stopped = job.proc.returncode != 0 and "saved" in message and (save_folder / "ep0-ba5").is_dir()
        job = run_to_end(world, run, run_dir, 2)  # the NaN is not armed again: resumed after the batch
        got = final_weights(world, str(save_folder))
        same = got is not None and all(torch.equal(skip_weights[k], got[k]) for k in skip_weights)
        ok = stopped and job.proc.returncode == 0 and same
        note = f"stopped with ep0-ba5 saved; resumed, it equals the skip run bitwise: {same}"
    else:
        ok = job.proc.returncode != 0 and "nan at batch 5" in message and not (save_folder / "ep0-ba5").exists()
        note = f"`{message[:110]}`; newest checkpoint ep0-ba4"
    row.survived += int(ok)
    row.notes.append(note)
    print(f"  {row.fault}: {ok} {note}", flush=True)


def rank_dies_in_collective(world: World, row: Row) -> None:
    name = "rank-dies-in-collective"
    run_dir = world.work / name
    flag = run_dir / "stalled"
    run_dir.mkdir(parents=True)
    save_folder = str(run_dir / "ckpt")
    run = recipe(world, name, save_folder)
    job = launch(world, run, run_dir, 1, dict(world.env(), CHAOS_STALL_AT="7", CHAOS_STALL_FLAG=str(flag)))
    wait_for(flag.exists, job, poll=0.05)
    time.sleep(1.0)  # rank 0 is now inside the step's first collective, waiting for rank 1
    killed_at = time.monotonic()
    kill(job, "one", random.Random(0))
    code = job.wait(300)
    ended_s = time.monotonic() - killed_at
    job = run_to_end(world, run, run_dir, 2)
    row.add(world, run_dir, save_folder, code != 0 and ended_s < 60 and job.proc.returncode == 0, 0,
            f"job ended {ended_s:.1f} s after the kill (exit {code}), then resumed")


# ----------------------------------------------------------------------------------------------- main
def reference(world: World) -> None:
    run_dir = world.work / "reference"
    job = run_to_end(world, recipe(world, "reference", str(run_dir / "ckpt")), run_dir, 1)
    if job.proc.returncode != 0:
        sys.exit(f"the reference run failed:\n{job.log.read_text()[-3000:]}")
    world.reference = {"weights": final_weights(world, str(run_dir / "ckpt")), "batches": effective_batches(run_dir)}


def table(rows: list[Row]) -> str:
    lines = ["| fault | trials | survived | bitwise-equal | lost checkpoints | lost samples | repeated samples | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        notes = collections.Counter(r.notes)
        text = "; ".join(f"{n} (x{c})" if c > 1 else n for n, c in notes.items())
        compared = [f"{r.bitwise}/{r.trials}", r.lost_checkpoints, r.lost_samples, r.repeated_samples]
        cells = " | ".join(str(c) if r.compared else "n/a" for c in compared)
        lines.append(f"| {r.fault} | {r.trials} | {r.survived}/{r.trials} | {cells} | {text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILL trials, spread over the kill rows")
    parser.add_argument("--kill-kinds", nargs="*", type=int, default=None, help="only these kill rows (0-5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--s3-outage-s", type=float, default=30.0)
    parser.add_argument("--only", nargs="*", default=None, help="row groups: kill s3 disk data checkpoint nan collective")
    parser.add_argument("--results", type=Path, default=None, help="append the table (markdown) to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (runs' logs) for a look")
    args = parser.parse_args()
    groups = set(args.only or ["kill", "s3", "disk", "data", "checkpoint", "nan", "collective"])
    rng = random.Random(args.seed)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    world = make_world(work)
    print(f"work folder {work}; reference run ...", flush=True)
    reference(world)
    rows: list[Row] = []
    if "kill" in groups:
        kinds = [(m, t) for m in ("random", "checkpoint write", "upload") for t in ("all", "one")]
        kinds = [kinds[i] for i in args.kill_kinds] if args.kill_kinds else kinds
        by_kind = {k: Row(kill_row_name(*k)) for k in kinds}
        for trial in range(args.kills):
            kind = kinds[trial % len(kinds)]
            kill_trial(world, by_kind[kind], *kind, trial, rng)
        rows += list(by_kind.values())
    if "s3" in groups:
        rows.append(Row(f"S3 endpoint down {args.s3_outage_s:g} s mid-upload"))
        s3_outage(world, rows[-1], args.s3_outage_s, None)
        rows.append(Row("S3 endpoint down 40 s, retry budget 10 s"))
        s3_outage(world, rows[-1], 40.0, 10.0)
    if "disk" in groups:
        rows.append(Row("disk full during a save (tmpfs)"))
        disk_full(world, rows[-1])
    if "data" in groups:
        for damage in ("truncated", "bit-flipped"):
            rows.append(Row(f"{damage} MDS shard" + (" (validate_hash: xxh64)" if damage == "bit-flipped" else "")))
            damaged_data(world, rows[-1], damage)
    if "checkpoint" in groups:
        for damage in ("truncated", "bit-flipped"):
            rows.append(Row(f"{damage} checkpoint shard"))
            damaged_checkpoint(world, rows[-1], damage)
    if "nan" in groups:
        skip_weights: dict = {}
        for action in ("skip", "checkpoint", "stop"):
            rows.append(Row(f"NaN loss, loss_spike_guard action: {action}"))
            nan_loss(world, rows[-1], action, skip_weights)
    if "collective" in groups:
        rows.append(Row("rank 1 killed while rank 0 waits in a collective"))
        rank_dies_in_collective(world, rows[-1])
    world.proxy.down()
    world.s3.stop()
    text = table(rows)
    print(text)
    print(f"total {time.monotonic() - started:.0f} s; work folder {work}")
    if args.results:
        with open(args.results, "a") as f:
            f.write(f"\n`python benchmarks/chaos.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}, "
                    f"{os.cpu_count()} CPUs, torch {torch.__version__}, {time.monotonic() - started:.0f} s)\n\n"
                    f"{text}\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
