"""The world benchmarks/chaos.py runs its faults in: tiny data and tokenizer, a moto S3 server behind a proxy that
can slow or cut connections, the 2-rank FSDP recipe, jobs (torchrun attempts) and reading their results against the
reference run (final weights, checkpoints complete, the samples each batch trained on)."""

from __future__ import annotations

import collections
import json
import os
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
from tests.distributed.helpers import WORKER, kill_tree, torchrun_args, worker_env  # noqa: E402
from tests.helpers import TINY_RECIPE_SEQ, convert_text_folder, make_corpus, tiny_recipe, write_text_folder  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402

BATCHES = 12
SAVE_EVERY = 2
BUCKET = "chaos"
FSDP = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
FAULTS_FILE = Path(__file__).with_name("chaos_faults.py")  # code_paths file: faults set off inside the run


@dataclass
class World:
    work: Path
    mds: Path
    tokenizer: Path
    s3: MotoS3Server
    proxy: TcpProxy
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
    # this process reads the runs' results through llmfoundry's own store client (any scheme), which reads these
    os.environ.update(AWS_ACCESS_KEY_ID="chaos", AWS_SECRET_ACCESS_KEY="chaos", AWS_DEFAULT_REGION="us-east-1",
                      S3_ENDPOINT_URL=s3.url, AWS_ENDPOINT_URL_S3=s3.url)
    return World(work, mds, tokenizer, s3, TcpProxy("127.0.0.1", s3.port).up())


def recipe(world: World, name: str, save_folder: str, **extra) -> dict:
    r = tiny_recipe(world.mds, world.tokenizer, eval_loader=None, max_duration=f"{BATCHES}ba", python_log_level=None,
                    save_interval=f"{SAVE_EVERY}ba", save_folder=save_folder, autoresume=True, run_name=name,
                    fsdp_config=FSDP, code_paths=[str(FAULTS_FILE)],
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


def launch(world: World, run: dict, run_dir: Path, attempt: int, env: dict | None = None, python: str | None = None,
           **popen) -> Job:
    """Start attempt ``attempt`` of ``run`` (torchrun, 2 ranks) with ``python`` (default: this one); ``popen``:
    more of subprocess.Popen's arguments (user, group, umask, ...)."""
    folder = run_dir / f"attempt{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    run = json.loads(json.dumps(run).replace("SAMPLES", str(folder)))
    run["loggers"] = {"jsonl": {"path": str(folder / "metrics.jsonl")}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    log = folder / "log.txt"
    command = [python or sys.executable, *torchrun_args(2)[1:], str(WORKER), str(path)]
    proc = subprocess.Popen(command, cwd=folder, env=env or world.env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True, **popen)
    return Job(proc, folder, log)


def wait_for(predicate, job: Job, timeout: float = 300, poll: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if job.proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def run_to_end(world: World, run: dict, run_dir: Path, attempt: int, env=None) -> Job:
    job = launch(world, run, run_dir, attempt, env)
    job.wait()
    return job


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


def _remote(save_folder: str):
    """The ObjectFolder of a save_folder on any store the trainer takes (s3://, gs://, Azure)."""
    from llmfoundry.core import objectstore

    return objectstore.ObjectFolder(save_folder, "save_folder", max_attempts=3, stores=objectstore.CHECKPOINT_STORES)


def complete_checkpoints(world: World, save_folder: str) -> set[str]:
    if "://" in save_folder:
        folder = _remote(save_folder)
        start = len(folder.prefix) + 1 if folder.prefix else 0
        return {k[start:].split("/")[0] for k in folder.list_keys() if k.endswith("/.complete")}
    return {p.name for p in Path(save_folder).glob("ep*-ba*") if (p / ".metadata").exists()}


def final_weights(world: World, save_folder: str) -> dict[str, torch.Tensor] | None:
    name = f"ep0-ba{BATCHES}"
    if "://" in save_folder:
        folder = _remote(save_folder)
        if not folder.exists(name, ".complete"):
            return None
        return local_weights(folder.download(name, Path(tempfile.mkdtemp(dir=world.work))))
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
