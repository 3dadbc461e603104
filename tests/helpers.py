"""Plain helpers shared by several test folders (fixtures live in the conftest.py files).

Test modules import these as ``from tests.helpers import ...``; no test module imports a conftest.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# The bucket the ``s3_server`` fixture (tests/conftest.py) creates on the moto server.
S3_TEST_BUCKET = "llmfoundry-test"
GCS_TEST_BUCKET = "llmfoundry-gcs-test"
OCI_TEST_BUCKET = "llmfoundry-oci-test"  # the bucket the ``oci_server`` fixture makes on the OCI stand-in (moto)
AZURE_TEST_CONTAINER = "llmfoundry-azure-test"  # the container the ``azure_server`` fixture makes on Azurite

_WORDS = (
    "the a model learns to predict next token from data which flows through layers of attention and "
    "feed forward networks while an optimizer updates weights after each batch of text samples in order "
    "cat dog runs jumps quickly slowly over under river mountain city small large blue green red"
).split()


def make_corpus(num_docs: int = 200, seed: int = 0) -> list[str]:
    """Deterministic English-like documents of a few sentences each."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
            sentences.append(" ".join(words).capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def write_prompt_response_jsonl(path: Path, docs: list[str]) -> Path:
    """A finetuning JSONL file: per document with two sentences or more, the first is the prompt, the rest the response."""
    rows = [doc.split(". ", 1) for doc in docs if ". " in doc]
    path.write_text("".join(json.dumps({"prompt": p + ".", "response": " " + r}) + "\n" for p, r in rows))
    return path


def write_text_folder(folder: Path, docs: list[str]) -> Path:
    """One .txt file per document in ``folder`` (created if needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_text(doc)
    return folder


def convert_text_folder(source: Path, out: Path, tokenizer_dir: Path, concat_tokens: int) -> Path:
    """MDS shards of ``concat_tokens``-token samples in ``out``, made from the .txt files in ``source``."""
    from llmfoundry.data.prep import text

    argv = ["--input_folder", str(source), "--output_folder", str(out), "--concat_tokens", str(concat_tokens),
            "--tokenizer", str(tokenizer_dir), "--processes", "1", "--quiet"]
    assert text.main(argv) == 0, f"the text converter failed on {source}"
    return out


# Sequence length of the MDS samples in the ``mds_root`` fixture and of the tiny training recipe.
TINY_RECIPE_SEQ = 64


def tiny_recipe(mds_root: Path, tokenizer_dir: Path, **overrides) -> dict:
    """A tiny training recipe (a 2-layer MPT, 12 batches) over the ``mds_root`` fixture's train/val splits."""
    seq = TINY_RECIPE_SEQ
    recipe = {
        "seed": 7,
        "max_seq_len": seq,
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": seq, "vocab_size": 512, "attn_config": {"attn_impl": "torch", "alibi": True},
                  "learned_pos_emb": False},
        "tokenizer": {"name": str(tokenizer_dir)},
        "train_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "train", "shuffle": True,
                                                     "shuffle_seed": 3, "max_seq_len": seq}, "drop_last": True},
        "eval_loader": {"name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": seq},
                        "drop_last": False},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "weight_decay": 1e-5},
        "scheduler": {"name": "cosine_with_warmup", "t_warmup": "2ba", "alpha_f": 0.1},
        "algorithms": {"gradient_clipping": {"clipping_threshold": 1.0}},
        "max_duration": "12ba",
        "eval_interval": "6ba",
        "global_train_batch_size": 8,
        "device_train_microbatch_size": 4,
        "device_eval_batch_size": 8,
        "progress_bar": False,
        "log_to_console": False,
    }
    recipe.update(overrides)
    return recipe


def make_trainer(recipe: dict):
    """A Trainer for a plain recipe dict, validated as ``llmfoundry train`` validates it."""
    from llmfoundry.train.recipe import TrainConfig, validate
    from llmfoundry.train.trainer import Trainer

    return Trainer(validate(recipe, TrainConfig), recipe)


def autoresume_in_another_process(plain: dict, folder: Path, max_duration: str = "3ba") -> str:
    """``plain`` run again by `llmfoundry train` in a process of its own, with ``autoresume`` and a longer
    ``max_duration``: the process inherits the store's variables; asserts it exits 0; returns its stdout."""
    import os
    import subprocess
    import sys

    import yaml

    recipe_file = folder / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump({**plain, "max_duration": max_duration, "autoresume": True,
                                           "log_to_console": True}))
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(recipe_file)],
                            capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def weights(trainer) -> dict:
    """A detached copy of a trainer's model weights (to compare runs bitwise)."""
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def batch_rows(batches) -> list[tuple[int, ...]]:
    """Every sample of a sequence of loader batches, as tuples of token ids (to compare data orders)."""
    return [tuple(r) for b in batches for r in b["input_ids"].tolist()]


def write_tiny_gpt2(folder: Path, vocab_size: int = 512, seq: int = TINY_RECIPE_SEQ, seed: int = 17,
                    n_embd: int = 64, n_head: int = 4) -> Path:
    """A 2-layer GPT-2 (d 64, 4 heads unless told, no dropout) saved as a Hugging Face folder, for ``hf_causal_lm`` recipes.

    The weights are drawn here from ``seed`` (normal(0, 0.02) for matrices and embeddings, zero biases, unit norm
    weights), not by transformers' initialisers, so every transformers version writes the same folder.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if (folder / "config.json").exists():
        return folder
    config = GPT2Config(vocab_size=vocab_size, n_positions=seq, n_embd=n_embd, n_layer=2, n_head=n_head,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.transformer.named_parameters()):
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(folder)
    return folder


def write_word_tokenizer(folder: Path, docs: list[str]) -> Path:
    """A word-level tokenizer over the words of ``docs`` (about 100 tokens), saved as a Hugging Face folder.

    Small on purpose: llm-foundry stores the tokenizer inside each checkpoint (a sharded one keeps every vocabulary
    entry as its own record), so the Composer checkpoint fixtures stay a few hundred KB.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if (folder / "tokenizer.json").exists():
        return folder
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<|endoftext|>", "<|pad|>", "<unk>"], show_progress=False)
    tokenizer.train_from_iterator(docs, trainer=trainer)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                           bos_token="<|endoftext|>", pad_token="<|pad|>", unk_token="<unk>")
    hf_tokenizer.save_pretrained(str(folder))
    config_file = folder / "tokenizer_config.json"  # llm-foundry's transformers 4 reads the same files
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=1))
    return folder


def build_composer_fixture_data(work: Path, seq: int = 64) -> tuple[Path, Path]:
    """(MDS folder of ``seq``-token samples, tokenizer folder) that tests/fixtures/composer was trained on."""
    corpus = make_corpus()
    tokenizer_dir = write_word_tokenizer(work / "tokenizer", corpus)
    mds = work / "mds"
    if not (mds / "index.json").exists():
        convert_text_folder(write_text_folder(work / "text", corpus[:160]), mds, tokenizer_dir, seq)
    return mds, tokenizer_dir


def upload_split(mds_root: Path, split: str, url: str) -> None:
    """Copy the local MDS split ``mds_root/split`` to ``url/split`` in a store (s3://, gs://, azure://), file by
    file."""
    from llmfoundry.core import objectstore

    folder = Path(mds_root, split)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        objectstore.write_bytes(f"{url}/{split}/{path.relative_to(folder).as_posix()}", path.read_bytes(),
                                stores=objectstore.DATA_STORES)


# torchao (the float8 extra) stays out of the test environment itself: once installed, transformers imports it in
# every process that loads a model (1-2 s each). scripts/install.sh dev puts it in this folder; only the float8
# tests, and the ranks they start, look there.
FLOAT8_LIBRARIES = Path(__file__).resolve().parents[1] / ".extras" / "float8"


def make_torchao_importable() -> None:
    """Make ``import torchao`` work in this process: installed, or from scripts/install.sh's FLOAT8_LIBRARIES."""
    import importlib.util
    import sys

    if importlib.util.find_spec("torchao") is not None:
        return
    if not (FLOAT8_LIBRARIES / "torchao").is_dir():
        raise RuntimeError(f"torchao is needed by the float8 tests: run `bash scripts/install.sh dev` (it puts torchao "
                           f"in {FLOAT8_LIBRARIES}) or pip install 'llmfoundry[float8]'")
    sys.path.insert(0, str(FLOAT8_LIBRARIES))
    importlib.invalidate_caches()


def run_as_nobody(action) -> int:
    """Run ``action`` in a forked child that drops to user nobody (the caller is root); its exit code says how it
    went (0: done, 13: a PermissionError, 1: another error; ``action`` may exit with its own code)."""
    import os

    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            action()
            os._exit(0)
        except PermissionError:
            os._exit(13)
        except BaseException:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
