"""benchmarks/chaos.py's ``stores`` rows: a fault proxy (tests/http_fault_proxy.py) between the 2-rank run and its
store -- S3 (moto), GCS (gcp-storage-emulator), Azure (Azurite) -- answering storms of 503s on a resume's reads and
500s on upload requests, and an S3-compatible store refusing CRC checksum headers (as OCI's and B2's S3 APIs)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from benchmarks.chaos_world import (BATCHES, BUCKET, SAVE_EVERY, Row, World, complete_checkpoints, launch, recipe,
                                    run_to_end, wait_for)
from tests.distributed.helpers import kill_tree
from tests.http_fault_proxy import FaultProxy


class Stores:
    """The emulators of the stores rows, started on first use; ``env(store, endpoint)`` points a run at one."""

    def __init__(self, world: World):
        self.world = world
        self.gcs = None
        self.azurite = None

    def target(self, store: str) -> tuple[str, int, str]:
        """(host, port, path prefix) of ``store``'s server (creating its bucket the first time)."""
        from urllib.parse import urlparse

        if store == "s3":
            url = self.world.s3.url
        elif store == "gs":
            if self.gcs is None:
                from tests.conftest import GCSEmulator

                self.gcs = GCSEmulator()
                self.gcs.reset(BUCKET)
                os.environ["STORAGE_EMULATOR_HOST"] = self.gcs.url  # this process reads the results directly
            url = self.gcs.url
        else:
            if self.azurite is None:
                from tests.conftest import Azurite

                setup = subprocess.run(["bash", str(Path(__file__).resolve().parents[1] / "tests/setup_azurite.sh")],
                                       capture_output=True, text=True, timeout=600)
                if setup.returncode != 0:
                    raise RuntimeError(f"Azurite cannot be installed here: {setup.stderr.strip()[-300:]}")
                self.azurite = Azurite(setup.stdout.strip().splitlines()[-1], self.world.work)
                self.azurite.reset(BUCKET)
                os.environ["AZURE_STORAGE_CONNECTION_STRING"] = self.azurite.connection_string
            url = self.azurite.url
        parsed = urlparse(url)
        return parsed.hostname, parsed.port, parsed.path

    def env(self, store: str, endpoint: str | None = None) -> dict[str, str]:
        """A run's environment with ``store`` reached at ``endpoint`` (a proxy's URL; default: the server)."""
        host, port, path = self.target(store)
        endpoint = endpoint or f"http://{host}:{port}"
        if store == "s3":
            return {**self.world.env(), "S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
        if store == "gs":
            return {**self.world.env(), "STORAGE_EMULATOR_HOST": endpoint}
        connection = self.azurite.connection_string.replace(self.azurite.url, f"{endpoint}{path}")
        return {**self.world.env(), "AZURE_STORAGE_CONNECTION_STRING": connection}

    def proxy(self, store: str, **faults) -> FaultProxy:
        """A tests/http_fault_proxy.FaultProxy in front of ``store``'s server."""
        host, port, _ = self.target(store)
        return FaultProxy(host, port, **faults)

    def run(self, store: str, name: str) -> tuple[Path, str, dict]:
        """(run folder, save_folder on ``store``, recipe) of the run ``name``."""
        save_folder = f"{SCHEMES[store]}://{BUCKET}/{name}"
        return self.world.work / name, save_folder, recipe(self.world, name, save_folder)

    def stop(self) -> None:
        if self.gcs is not None:
            self.gcs.stop()
        if self.azurite is not None:
            self.azurite.stop()


SCHEMES = {"s3": "s3", "gs": "gs", "azure": "azure"}
STORE_NAMES = {"s3": "S3 (moto)", "gs": "GCS (emulator)", "azure": "Azure (Azurite)"}


def storm_at_resume(world: World, stores: Stores, row: Row, store: str, failures: int = 5) -> None:
    run_dir, save_folder, run = stores.run(store, f"{store}-503-at-resume")
    job = launch(world, run, run_dir, 1, stores.env(store))
    wait_for(lambda: "ep0-ba6" in complete_checkpoints(world, save_folder), job, poll=0.1)
    kill_tree(job.proc)
    before = complete_checkpoints(world, save_folder)
    proxy = stores.proxy(store, failures=failures, status=503, methods=("GET", "HEAD"))
    try:
        job = run_to_end(world, run, run_dir, 2, stores.env(store, proxy.url))
    finally:
        proxy.close()
    after = complete_checkpoints(world, save_folder)
    first_step = min(re.findall(r'"step": (\d+)', (job.folder / "metrics.jsonl").read_text()) or ["1"], key=int)
    resumed_at = int(first_step) - 1  # the attempt's first trained batch follows the checkpoint it resumed from
    row.add(world, run_dir, save_folder, job.proc.returncode == 0 and proxy.answered_with_errors > 0 and
            resumed_at >= 6, len(before - after), f"{proxy.answered_with_errors} reads answered 503; "
            + (f"resumed from ep0-ba{resumed_at}" if resumed_at
               else f"no batch trained: `{job.last_line()[:150]}`" if job.proc.returncode else "started over"))


def storm_during_uploads(world: World, stores: Stores, row: Row, store: str, failures: int = 3) -> None:
    run_dir, save_folder, run = stores.run(store, f"{store}-500-uploads")
    proxy = stores.proxy(store, failures=failures, status=500, methods=("PUT", "POST"))
    try:
        job = run_to_end(world, run, run_dir, 1, stores.env(store, proxy.url))
    finally:
        proxy.close()
    expected = {f"ep0-ba{b}" for b in range(SAVE_EVERY, BATCHES + 1, SAVE_EVERY)}
    lost = len(expected - complete_checkpoints(world, save_folder))
    row.add(world, run_dir, save_folder, job.proc.returncode == 0 and proxy.answered_with_errors > 0, lost,
            f"{proxy.answered_with_errors} upload requests answered 500")


def refuses_crc_checksums(world: World, stores: Stores, row: Row) -> None:
    """An S3-compatible store that refuses CRC checksum headers (OCI's and B2's S3 APIs, some MinIO versions): a
    run saves through it, is SIGKILLed once ep0-ba6 is complete, and the same command resumes through it."""
    run_dir, save_folder, run = stores.run("s3", "s3-refuses-crc")

    def refuse(method, path, headers):
        named = [h for h in headers.keys() if h.lower().startswith(("x-amz-checksum-crc", "x-amz-sdk-checksum"))]
        return (400, "InvalidArgument", f"checksum headers not supported: {named}") if named else None

    proxy = stores.proxy("s3", failures=0, refuse=refuse)
    try:
        job = launch(world, run, run_dir, 1, stores.env("s3", proxy.url))
        wait_for(lambda: "ep0-ba6" in complete_checkpoints(world, save_folder), job, poll=0.1)
        kill_tree(job.proc)
        job = run_to_end(world, run, run_dir, 2, stores.env("s3", proxy.url))
    finally:
        proxy.close()
    row.add(world, run_dir, save_folder, job.proc.returncode == 0 and not proxy.refused, 0,
            f"{len(proxy.refused)} requests refused for their checksum headers")
