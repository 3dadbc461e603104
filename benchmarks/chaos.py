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
* ``stores`` rows put a fault proxy (tests/http_fault_proxy.py) between the run and its store: S3 (moto), GCS
  (gcp-storage-emulator) and Azure (Azurite, where node is installed). A *storm* answers the first N requests of
  each method and path with an error before forwarding: 5 x 503 for every read of a resume (the run was first
  SIGKILLed once ep0-ba6 was complete), 3 x 500 for every upload request of a whole run (on S3 a path is one object
  or one part; GCS's uploads share one path, so there only the first few uploads meet it). The CRC row refuses, as
  OCI's and B2's S3 APIs do, any request carrying a CRC checksum header, for a run that is killed and resumed.
* ``users`` (benchmarks/chaos_users.py, needs root): a second Unix user's job of the same recipe, from its own copy
  of the data, starts with the first (root's) job or after a random batch of it (the first waits there until the
  second has registered its shared memory); both stream through /dev/shm and register under the machine-wide lock
  file, which is as found, created by the first job under umask 077, or left 0600 by another user (one trial each).
  Both must exit 0; the first is compared as every row's, the second's weights, checkpoints and samples with the
  reference too.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.chaos_world import (  # noqa: E402
    BATCHES,
    BUCKET,
    SAVE_EVERY,
    Job,
    Row,
    World,
    wait_for,
    complete_checkpoints,
    effective_batches,
    final_weights,
    launch,
    make_world,
    recipe,
    run_to_end,
    s3_client,
    s3_keys,
)
from benchmarks.chaos_stores import STORE_NAMES, Stores, refuses_crc_checksums, storm_at_resume, storm_during_uploads  # noqa: E402,E501
from benchmarks.chaos_users import second_user_rows  # noqa: E402
from tests.distributed.helpers import descendants, kill_tree  # noqa: E402


# ----------------------------------------------------------------------------------------------- faults
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
    parser.add_argument("--only", nargs="*", default=None,
                        help="row groups: kill s3 disk data checkpoint nan collective stores users")
    parser.add_argument("--stores", nargs="*", default=["s3", "gs", "azure"],
                        help="the stores of the stores rows' storms (s3 gs azure)")
    parser.add_argument("--results", type=Path, default=None, help="append the table (markdown) to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (runs' logs) for a look")
    args = parser.parse_args()
    groups = set(args.only or ["kill", "s3", "disk", "data", "checkpoint", "nan", "collective", "stores", "users"])
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
    if "stores" in groups:
        stores = Stores(world)
        try:
            for store in args.stores:
                rows.append(Row(f"{STORE_NAMES[store]}: 5 consecutive 503s for every read of a resume"))
                storm_at_resume(world, stores, rows[-1], store)
            for store in args.stores:
                rows.append(Row(f"{STORE_NAMES[store]}: 3 consecutive 500s for every upload request"))
                storm_during_uploads(world, stores, rows[-1], store)
            if "s3" in args.stores:
                rows.append(Row("S3-compatible store refusing CRC checksum headers (as OCI, B2): save, kill, resume"))
                refuses_crc_checksums(world, stores, rows[-1])
        finally:
            stores.stop()
    if "users" in groups:
        second_user_rows(world, rows, args.seed, args.keep)
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
