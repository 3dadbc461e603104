"""Which rank wrote which file of a checkpoint, and each file's size and checksum.

Every rank records the files it wrote (its DCP shard ``__{r}_0.distcp`` and ``rank{r}.pt``; rank 0 also
``.metadata``, ``config.yaml``, the tokenizer, ``model_full.pt``) in ``checksums/rank{r}.json``: size and xxh3-64
of each. Loading verifies them first, so a truncated or bit-flipped file (a disk error, a copy cut short, a
damaged object in a bucket) is a one-line error naming the file, instead of a wrong model or a stack trace from deep
inside DCP. xxh3 runs at memory speed (several GB/s per core): cheap next to writing the bytes, and every rank hashes
only its own files. Checkpoints written before checksums existed, or by Composer, have none and are not checked.

The same ownership decides what each rank uploads to an object store (train.uploads).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import xxhash

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError

CHECKSUMS = "checksums"
_PER_RANK = re.compile(r"^(?:__(\d+)_\d+\.distcp|rank(\d+)\.pt|checksums/rank(\d+)\.json)$")
_CHUNK = 8 << 20


def owner(rel: str) -> int:
    """The rank that wrote the checkpoint file at ``rel`` (a path relative to the checkpoint folder)."""
    match = _PER_RANK.match(rel)
    return int(next(g for g in match.groups() if g is not None)) if match else 0


def owned_files(folder: Path, rank: int) -> list[Path]:
    """The files of a checkpoint folder that ``rank`` wrote (rank 0: everything that is not per-rank)."""
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and owner(p.relative_to(folder).as_posix()) == rank]


def file_digest(path: Path) -> str:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_checksums(folder: Path, rank: int) -> None:
    """Write ``checksums/rank{rank}.json`` for the files this rank wrote into ``folder`` (after writing them)."""
    out = folder / CHECKSUMS / f"rank{rank}.json"
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "xxh3_64": file_digest(p)}
             for p in owned_files(folder, rank) if p != out}
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))


def damaged_file(folder: Path, manifest: Path) -> str | None:
    """What is wrong with the files ``manifest`` lists, or None when each has its recorded size and checksum."""
    try:
        files = json.loads(manifest.read_text())["files"]
        entries = [(str(rel), int(info["size"]), str(info["xxh3_64"])) for rel, info in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"'{manifest}' is not a readable checksum list"
    for rel, size, expected in entries:
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            return f"'{manifest}' names a file outside the checkpoint ('{rel}')"
        if not path.is_file():
            return f"'{path}' is missing"
        actual_size = path.stat().st_size
        if actual_size != size:
            return f"'{path}' has {actual_size} bytes, {size} were written (truncated or replaced)"
        if file_digest(path) != expected:
            return f"'{path}' does not match its checksum (the file is damaged)"
    return None


def verify_checkpoint(folder: Path, key: str = "load_path") -> None:
    """Check every recorded file of checkpoint ``folder`` (collective when a process group is up: rank r checks
    the lists of ranks r, r + world, ...); a damaged file is a ConfigError on every rank, naming the file."""
    manifests = sorted((folder / CHECKSUMS).glob("rank*.json"))
    mine = manifests[dist.rank()::dist.world_size()]
    problems = [p for m in mine if (p := damaged_file(folder, m)) is not None]
    problems = [p for found in dist.all_gather_object(problems) for p in found]
    if problems:
        raise ConfigError(f"{key}: checkpoint file {problems[0]}; resume from an earlier checkpoint (set load_path "
                          f"to it, or delete '{folder}' so that autoresume picks the previous one)")
