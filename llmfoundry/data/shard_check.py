"""Checks of a local MDS folder against its index.json before training reads it.

streaming checks a shard only when it downloads or decompresses one; a shard that is already in the local folder
is read as it is, so a truncated file fails deep inside a worker and a flipped bit becomes a wrong sample, silently.
Here every shard file present must have the size the index records (a stat per shard: cheap), and with
``validate_hash`` set, the checksum too (read once per process; the converters write xxh64 checksums). A problem is
a one-line error naming the file.
"""

from __future__ import annotations

import json
import os

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.streaming_guard import import_streaming


def _shard_files(index: dict) -> list[dict]:
    files = []
    for shard in index.get("shards", []):
        files += [info for info in (shard.get("raw_data"), shard.get("zip_data")) if isinstance(info, dict)]
    return files


def check_local_shards(folder: str, validate_hash: str | None, key: str) -> None:
    """Compare the shards in ``folder`` (holding index.json) with the index: sizes always, checksums when asked."""
    index_path = os.path.join(folder, "index.json")
    try:
        with open(index_path) as f:
            index = json.load(f)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{key}: '{index_path}' is not a readable MDS index ({error})") from None
    get_hash = import_streaming().base.hashing.get_hash if validate_hash else None
    fix = "re-run the converter, or copy the file again"
    for info in _shard_files(index):
        path = os.path.join(folder, str(info.get("basename", "")))
        if not os.path.isfile(path):
            continue  # a raw shard that is only there compressed (or the reverse): streaming makes it when needed
        size, expected = os.path.getsize(path), info.get("bytes")
        if isinstance(expected, int) and size != expected:
            raise ConfigError(f"{key}: shard '{path}' has {size} bytes, the index records {expected} (truncated or "
                              f"replaced; {fix})")
        if get_hash is None:
            continue
        recorded = (info.get("hashes") or {}).get(validate_hash)
        if recorded is None:
            raise ConfigError(f"{key}.validate_hash: shard '{path}' has no {validate_hash} checksum in its index "
                              f"(the converter wrote {sorted(info.get('hashes') or {}) or 'none'}; unset validate_hash)")
        with open(path, "rb") as f:
            actual = get_hash(validate_hash, f.read())
        if actual != recorded:
            raise ConfigError(f"{key}: shard '{path}' does not match its {validate_hash} checksum (the file is "
                              f"damaged; {fix})")
