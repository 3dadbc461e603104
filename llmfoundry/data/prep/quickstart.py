"""Build the quickstart's data offline: a tokenizer and MDS shards from this Python's own standard library.

Every Python installation carries its standard library's source, so the quickstart needs no network. Files are
taken in sorted path order (deterministic for a given Python version); every n-th file is held out for validation.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from llmfoundry.data.prep import text
from llmfoundry.data.prep.quickstart_settings import PrepareDataConfig
from llmfoundry.data.tokenizer_training import train_bpe_tokenizer

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "lib2to3", "__pycache__"}


def stdlib_files(limit: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts))
    return files[:limit]


def prepare(settings: PrepareDataConfig) -> None:
    """Create folder/tokenizer, folder/train and folder/val unless they already exist."""
    folder = Path(settings.folder)
    tokenizer_dir = folder / "tokenizer"
    splits = {"train": folder / "train", "val": folder / "val"}
    if (tokenizer_dir / "tokenizer.json").exists() and all((p / "index.json").exists() for p in splits.values()):
        return
    files = stdlib_files(settings.max_files)
    if len(files) <= settings.val_files:
        raise ValueError(f"prepare_data: found only {len(files)} standard-library files")
    # Hold out evenly spaced files so that validation text is like training text (not one corner of the library).
    stride = len(files) // settings.val_files
    held_out = set(range(0, stride * settings.val_files, stride))
    by_split = {"val": [f for i, f in enumerate(files) if i in held_out],
                "train": [f for i, f in enumerate(files) if i not in held_out]}
    print(f"preparing quickstart data in {folder}: {len(files)} Python standard-library files", flush=True)

    if not (tokenizer_dir / "tokenizer.json").exists():
        print(f"  training a {settings.vocab_size}-token BPE tokenizer -> {tokenizer_dir}", flush=True)
        texts = (p.read_text(encoding="utf-8", errors="replace") for p in by_split["train"])
        train_bpe_tokenizer(texts, settings.vocab_size, tokenizer_dir)

    for split, out in splits.items():
        if (out / "index.json").exists():
            continue
        source = folder / "text" / split
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        for i, path in enumerate(by_split[split]):
            (source / f"{i:05d}.txt").write_text(path.read_text(encoding="utf-8", errors="replace"))
        print(f"  tokenizing the {split} split -> {out}", flush=True)
        text.main([
            "--input_folder", str(source), "--output_folder", str(out), "--tokenizer", str(tokenizer_dir),
            "--concat_tokens", str(settings.concat_tokens), "--compression", "zstd", "--reprocess", "--quiet",
        ])
