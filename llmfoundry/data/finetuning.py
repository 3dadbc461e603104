"""The ``finetuning`` loader: prompt/response and chat examples -> masked, optionally packed batches.

YAML (llm-foundry's shape)::

    train_loader:
      name: finetuning
      dataset:
        hf_name: json                     # or a hub id, a local dataset folder, or s3://bucket/folder ({split}.jsonl)
        hf_kwargs: {data_files: data/chat.jsonl}
        split: train
        max_seq_len: 2048
        target_prompts: none              # none | all | length>=N
        target_responses: last            # last | all
        packing_ratio: auto               # or a number (examples per row), or null for no packing
        shuffle: true
      drop_last: true

An example is ``{"prompt": ..., "response": ...}`` (or ``completion``), or ``{"messages": [{"role": ..., "content":
...}, ...]}`` with roles system/user/assistant/tool, formatted with the tokenizer's chat template (ChatML when it
has none); each assistant message ends a turn. Labels are -100 except on targets. An example longer than
``max_seq_len`` is truncated; one left with no target is dropped (counted in ``dataset.num_dropped`` and
reported). With packing, several examples share a row: ``sequence_id`` numbers them and no label crosses from one
example into the next. The loader's state is a global sample position, so resuming on any number of ranks works.
MDS data written by ``convert_finetuning_dataset.py`` (tokenized ``input_ids``/``labels``) is read with ``remote``/
``local``/``streams``.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.config.fields import option
from llmfoundry.data.text import IGNORE_INDEX, StreamingOptions, dataloader_kwargs, make_streaming_dataset
from llmfoundry.registry import dataloaders

log = logging.getLogger(__name__)

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class FinetuningDatasetSettings(StreamingOptions):
    """``train_loader.dataset`` for ``name: finetuning``."""

    hf_name: str | None = option(None, "a hub id, a local dataset folder, 'json' (with hf_kwargs.data_files), or s3://folder")
    hf_kwargs: dict[str, Any] = option(default_factory=dict, doc="passed to datasets.load_dataset (e.g. data_files)")
    preprocessing_fn: str | None = option(None, "module:function mapping a raw example to prompt/response or messages")
    max_seq_len: int = option(2048, "tokens per row; longer examples are truncated")
    decoder_only_format: bool = option(True, "prompt and response in one sequence (false: encoder-decoder style)")
    target_prompts: str = option("none", "which prompt tokens carry loss: none, all, or length>=N")
    target_responses: Literal["last", "all"] = option("last", "which responses carry loss: the last turn's or all")
    packing_ratio: float | Literal["auto"] | None = option(
        None, "examples per row when packing (a number >= 1), auto (largest ratio with no waste), or null (no packing)"
    )
    allow_pad_trimming: bool = option(False, "pad a batch only to its longest row instead of max_seq_len")
    pad_token_id: int | None = option(None, "id used for padding (default: the tokenizer's pad, else EOS)")


@dataclass
class FinetuningLoaderSettings:
    """``train_loader`` / ``eval_loader`` with ``name: finetuning``."""

    dataset: FinetuningDatasetSettings = option(default_factory=FinetuningDatasetSettings, doc="the examples")
    drop_last: bool = option(True, "drop the last incomplete batch of an epoch")
    num_workers: int = option(0, "DataLoader worker processes")
    prefetch_factor: int | None = option(None, "batches each worker loads ahead (needs num_workers > 0)")
    pin_memory: bool = option(False, "pin batches in page-locked memory")
    persistent_workers: bool = option(False, "keep workers alive between epochs (needs num_workers > 0)")
    timeout: float = option(0, "seconds to wait for a batch from a worker (0: forever)")


# ----------------------------------------------------------------------------------------------- reading examples
def _read_jsonl_records(path: str) -> list[tuple[str, dict]]:
    from llmfoundry.data.prep.json_data import iter_records

    return list(iter_records(path))


def load_raw_examples(ds: FinetuningDatasetSettings, key: str) -> list[tuple[str, dict]]:
    """(where, raw example) pairs of the configured split; ``where`` names file and line for error messages."""


    name, split = ds.hf_name, ds.split or "train"
    data_files = ds.hf_kwargs.get("data_files")
    if name is not None and objectstore.is_remote(name):
        path = objectstore.join(name, f"{split}.jsonl")
        if objectstore.read_bytes(path) is None:
            raise ConfigError(f"{key}.hf_name: '{path}' does not exist (the remote folder needs {split}.jsonl)")
        records = _read_jsonl_records(path)
    elif name == "json" and data_files is not None:
        if isinstance(data_files, dict):
            if split not in data_files:
                raise ConfigError(f"{key}.hf_kwargs.data_files: no files for split '{split}' (have {', '.join(data_files)})")
            data_files = data_files[split]
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        records = []
        for file in files:
            if not objectstore.is_remote(file) and not os.path.isfile(file):
                raise ConfigError(f"{key}.hf_kwargs.data_files: '{file}' does not exist")
            records += _read_jsonl_records(file)
    elif name is not None and name.endswith((".jsonl", ".json")) and os.path.isfile(name):
        records = _read_jsonl_records(name)
    elif name is not None:
        from llmfoundry.data.prep.json_data import load_hf_split

        keys = (dict(dataset_key="--dataset", split_key="--splits", files_key="--data_files") if key.startswith("--")
                else dict(dataset_key=f"{key}.hf_name", split_key=f"{key}.split", files_key=f"{key}.hf_kwargs.data_files"))
        data = load_hf_split(name, ds.hf_kwargs.get("name"), split, {k: v for k, v in ds.hf_kwargs.items() if k != "name"},
                             **keys)
        records = [(f"{name}[{split}][{i}]", dict(row)) for i, row in enumerate(data)]
    else:
        raise ConfigError(f"{key}: set hf_name (hub id, folder, json, s3://folder) or remote/local MDS data")
    if not records:
        raise ConfigError(f"{key}: split '{split}' of '{name}' is empty; point hf_name/hf_kwargs at data with examples")
    return records


# ----------------------------------------------------------------------------------------------- tokenizing
def _turns_prompt_response(example: dict, where: str) -> list[tuple[str, str]]:
    prompt = example.get("prompt")
    response_key = "completion" if "completion" in example and "response" not in example else "response"
    response = example.get(response_key)
    for field, value in (("prompt", prompt), (response_key, response)):
        if value is None:
            raise ConfigError(f"{where}: missing field '{field}' (an example needs prompt and response/completion, "
                              "or messages)")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")
    return [(prompt, response)]


def _check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ConfigError(f"{where}: messages[{i}] needs 'role' and 'content'")
        if message["role"] not in ROLES:
            raise ConfigError(f"{where}: messages[{i}].role '{message['role']}' is not one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise ConfigError(f"{where}: messages[{i}].content must be a string, got {type(message['content']).__name__}")
    if messages[-1]["role"] != "assistant":
        raise ConfigError(f"{where}: the last message must be from the assistant (it is '{messages[-1]['role']}')")


def _turns_chat(tokenizer, messages: list[dict], where: str) -> list[tuple[str, str]]:
    """Split a templated conversation into (prompt text, response text) per assistant message."""
    _check_messages(messages, where)
    template = tokenizer.chat_template or CHATML_TEMPLATE

    def render(msgs, generation_prompt):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt,
                                             chat_template=template)

    turns, done = [], ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:k], True)
        through = render(messages[: k + 1], False)
        if not before.startswith(done) or not through.startswith(before):
            raise ConfigError(f"{where}: the chat template does not render turns as prefixes of each other; "
                              "use a template whose output only grows with the conversation")
        turns.append((before[len(done):], through[len(before):]))
        done = through
    return turns


def tokenize_example(tokenizer, example: dict, where: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per turn; the last response ends with EOS."""
    if "messages" in example:
        turns = _turns_chat(tokenizer, example["messages"], where)
    else:
        turns = _turns_prompt_response(example, where)
    out = []
    for i, (prompt, response) in enumerate(turns):
        prompt_ids = tokenizer(prompt, add_special_tokens=(i == 0 and "messages" not in example))["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        out.append((list(prompt_ids), list(response_ids)))
    eos = tokenizer.eos_token_id
    if out and (not out[-1][1] or out[-1][1][-1] != eos):
        out[-1][1].append(eos)
    return out


def _prompt_is_target(rule: str, length: int, key: str) -> bool:
    if rule == "none":
        return False
    if rule == "all":
        return True
    match = re.fullmatch(r"length>=(\d+)", rule.replace(" ", ""))
    if not match:
        raise ConfigError(f"{key}.target_prompts: expected none, all or length>=N, got '{rule}'")
    return length >= int(match.group(1))


def build_example(turns, ds: FinetuningDatasetSettings, key: str) -> dict[str, list[int]] | None:
    """input_ids and labels of one example, truncated to max_seq_len; None when no target token is left."""
    input_ids: list[int] = []
    labels: list[int] = []
    for i, (prompt, response) in enumerate(turns):
        last = i == len(turns) - 1
        prompt_target = _prompt_is_target(ds.target_prompts, len(prompt), key)
        response_target = last or ds.target_responses == "all"
        input_ids += prompt + response
        labels += (prompt if prompt_target else [IGNORE_INDEX] * len(prompt))
        labels += (response if response_target else [IGNORE_INDEX] * len(response))
    input_ids, labels = input_ids[: ds.max_seq_len], labels[: ds.max_seq_len]
    if labels:
        labels[0] = IGNORE_INDEX  # the first token is never predicted (also: no loss across packed examples)
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": input_ids, "labels": labels}


def build_encdec_example(turns, ds: FinetuningDatasetSettings) -> dict[str, list[int]] | None:
    """decoder_only_format false: the context is input_ids, the last response is labels."""
    context = [t for prompt, response in turns[:-1] for t in prompt + response] + turns[-1][0]
    response = turns[-1][1]
    input_ids, labels = context[-ds.max_seq_len:], response[: ds.max_seq_len]
    if not labels:
        return None
    return {"input_ids": input_ids, "labels": labels}


def _preprocessor(ds: FinetuningDatasetSettings, key: str):
    if not ds.preprocessing_fn:
        return None
    from llmfoundry.data.prep.common import callable_from_spec

    return callable_from_spec(ds.preprocessing_fn, f"{key}.preprocessing_fn")


def _build_examples(tokenizer, ds: FinetuningDatasetSettings, key: str, preprocess, items) -> list[dict | None]:
    """Tokenized examples of ``(where, raw)`` items, in order; None for one truncated to no target."""
    out: list[dict[str, list[int]] | None] = []
    for where, raw in items:
        if preprocess is not None:
            raw = preprocess(raw)
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: {ds.preprocessing_fn} returned {type(raw).__name__}, expected a dict")
        turns = tokenize_example(tokenizer, raw, where)
        out.append(build_example(turns, ds, key) if ds.decoder_only_format else build_encdec_example(turns, ds))
    return out


_worker_state: tuple | None = None


def _init_example_worker(tokenizer, ds: FinetuningDatasetSettings, key: str) -> None:
    global _worker_state
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _worker_state = (tokenizer, ds, key, _preprocessor(ds, key))  # the preprocessor is imported in each worker


def _build_examples_in_worker(items) -> list[dict | None]:
    assert _worker_state is not None
    return _build_examples(*_worker_state, items)


class FinetuningDataset(torch.utils.data.Dataset):
    """Tokenized examples in memory; ``num_dropped`` counts examples truncated to nothing to learn.

    ``num_workers > 1`` tokenizes chunks of examples in that many processes; the examples (and their order) are
    the same as with one.
    """

    def __init__(self, tokenizer, ds: FinetuningDatasetSettings, key: str, *, num_workers: int = 1):
        preprocess = _preprocessor(ds, key)
        raw = load_raw_examples(ds, key)
        if num_workers > 1 and len(raw) > 1:
            from llmfoundry.data.prep.common import mp_context

            per_chunk = max(1, min(1000, math.ceil(len(raw) / (num_workers * 4))))
            chunks = [raw[i : i + per_chunk] for i in range(0, len(raw), per_chunk)]
            with mp_context().Pool(min(num_workers, len(chunks)), initializer=_init_example_worker,
                                   initargs=(tokenizer, ds, key)) as pool:
                built = [example for part in pool.imap(_build_examples_in_worker, chunks) for example in part]
        else:
            built = _build_examples(tokenizer, ds, key, preprocess, raw)
        self.examples: list[dict[str, list[int]]] = [e for e in built if e is not None]
        self.num_dropped = len(built) - len(self.examples)
        if self.num_dropped:
            message = (f"{key}: dropped {self.num_dropped} of {self.num_dropped + len(self.examples)} examples with "
                       f"no target token left after truncation to max_seq_len={ds.max_seq_len}")
            log.warning(message)
            print(f"warning: {message}", flush=True)
        if not self.examples:
            raise ConfigError(f"{key}: no usable example (all {self.num_dropped} were truncated to nothing to learn); "
                              "raise max_seq_len")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]


def _mds_dataset_class():
    from llmfoundry.data.streaming_guard import import_streaming

    base = import_streaming().StreamingDataset

    class StreamingFinetuningDataset(base):
        def __getitem__(self, index: int) -> dict[str, list[int]]:
            sample = super().__getitem__(index)
            if "input_ids" not in sample or "labels" not in sample:
                raise ConfigError(f"finetuning MDS samples need input_ids and labels (have {sorted(sample)}); "
                                  "write them with data_prep/convert_finetuning_dataset.py")
            return {k: np.asarray(sample[k]).astype(np.int64).tolist() for k in ("input_ids", "labels")}

    return StreamingFinetuningDataset


# ----------------------------------------------------------------------------------------------- batches
def first_fit(lengths: list[int], capacity: int, rows: int) -> tuple[list[list[int]], list[int]]:
    """First-fit packing of examples (by index, in order) into ``rows`` bins; returns (bins, dropped indices)."""
    bins: list[list[int]] = []
    space: list[int] = []
    dropped = []
    for i, length in enumerate(lengths):
        for b, free in enumerate(space):
            if length <= free:
                bins[b].append(i)
                space[b] -= length
                break
        else:
            if len(bins) < rows:
                bins.append([i])
                space.append(capacity - length)
            else:
                dropped.append(i)
    return bins, dropped


class FinetuningCollator:
    """Pads (or packs, first-fit) examples into a batch of ``rows`` rows."""

    def __init__(self, ds: FinetuningDatasetSettings, pad_token_id: int, rows: int, packing: bool):
        self.max_seq_len = ds.max_seq_len
        self.pad = pad_token_id
        self.rows = rows
        self.packing = packing
        self.trim = ds.allow_pad_trimming
        self.decoder_only = ds.decoder_only_format
        self.num_dropped = 0  # examples that did not fit while packing

    def _tensor(self, rows: list[list[int]], fill: int, length: int) -> torch.Tensor:
        out = torch.full((len(rows), length), fill, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        if not self.decoder_only:
            length = self.max_seq_len if not self.trim else max(len(e["input_ids"]) for e in examples)
            label_length = self.max_seq_len if not self.trim else max(len(e["labels"]) for e in examples)
            ids = [e["input_ids"] for e in examples]
            return {
                "input_ids": self._tensor(ids, self.pad, length),
                "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, length),
                "labels": self._tensor([e["labels"] for e in examples], IGNORE_INDEX, label_length),
            }
        if self.packing:
            bins, dropped = first_fit([len(e["input_ids"]) for e in examples], self.max_seq_len, self.rows)
            if dropped:
                if not self.num_dropped:
                    log.warning("packing: %d examples did not fit into a batch and were skipped; lower "
                                "packing_ratio (auto avoids this for the first epoch)", len(dropped))
                self.num_dropped += len(dropped)
            bins += [[] for _ in range(self.rows - len(bins))]  # always `rows` rows (an empty one is all padding)
        else:
            bins = [[i] for i in range(len(examples))]
        ids, labels, seq = [], [], []
        for members in bins:
            ids.append([t for i in members for t in examples[i]["input_ids"]])
            labels.append([t for i in members for t in examples[i]["labels"]])
            seq.append([n for n, i in enumerate(members) for _ in examples[i]["input_ids"]])
        length = max(1, max(len(r) for r in ids)) if self.trim else self.max_seq_len
        batch = {
            "input_ids": self._tensor(ids, self.pad, length),
            "labels": self._tensor(labels, IGNORE_INDEX, length),
            "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, length),
        }
        if self.packing:
            batch["sequence_id"] = self._tensor(seq, -1, length)
        return batch


def auto_packing_ratio(lengths: list[int], max_seq_len: int, batch_size: int, *, max_ratio: float = 20.0) -> float:
    """The largest packing ratio for which first-fit packing drops no example of ``lengths``.

    ``lengths`` are the example lengths in epoch order (at most the first 20,000 are profiled); each batch of
    ``ceil(batch_size * ratio)`` consecutive examples must fit into ``batch_size`` rows of ``max_seq_len``.
    """
    sample = lengths[:20000]

    def wastes(ratio: float) -> bool:
        per_batch = max(batch_size, math.ceil(batch_size * ratio))
        for start in range(0, len(sample), per_batch):
            _, dropped = first_fit(sample[start : start + per_batch], max_seq_len, batch_size)
            if dropped:
                return True
        return False

    ratio, step = 1.0, 1.0
    while step >= 1 / batch_size - 1e-9:  # finer steps than 1/batch_size change nothing
        if ratio + step <= max_ratio and not wastes(ratio + step):
            ratio += step
        else:
            step /= 2
    return round(ratio, 4)


class FinetuningLoader:
    """Batches of finetuning examples with a resumable global sample position.

    Each epoch is a seeded permutation of the examples (or their order, without shuffle); step ``s`` of rank ``r``
    takes examples ``[(s * world + r) * n, ... + n)`` of it, where ``n`` is the examples per rank and batch.
    ``state_dict()`` is ``{"epoch", "sample_in_epoch"}`` counted over all ranks, so resuming with another world
    size continues at the same example.

    One torch DataLoader serves every epoch: its batch sampler (in this process) hands out the current epoch's index
    batches, so with ``persistent_workers`` the worker processes live across epochs.
    """

    def __init__(self, dataset, collator, examples_per_batch: int, settings: FinetuningLoaderSettings, key: str):
        self.dataset = dataset
        self.collator = collator
        self.examples_per_batch = examples_per_batch
        self.settings = settings
        self.shuffle = settings.dataset.shuffle
        self.seed = settings.dataset.shuffle_seed
        self.drop_last = settings.drop_last
        self.key = key
        self.epoch = 0
        self.sample_in_epoch = 0
        self._resume_from: int | None = None
        self._sampler = _EpochBatchSampler()
        kwargs = dataloader_kwargs(settings, key)
        kwargs.pop("drop_last")  # the sampler drops the last incomplete batch itself
        self.dataloader = torch.utils.data.DataLoader(dataset, batch_sampler=self._sampler, collate_fn=collator,
                                                      **kwargs)

    @staticmethod
    def _world() -> tuple[int, int]:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def __len__(self) -> int:
        _, world = self._world()
        per_step = self.examples_per_batch * world
        return len(self.dataset) // per_step if self.drop_last else math.ceil(len(self.dataset) / per_step)

    def _index_batches(self, start: int) -> list[tuple[int, list[int]]]:
        """(global position after the step, this rank's example indices) for each step of the epoch from ``start``."""
        rank, world = self._world()
        order = self._order(self.epoch)
        per_step = self.examples_per_batch * world
        batches = []
        for position in range(start, len(order), per_step):
            chunk = order[position : position + per_step]
            if len(chunk) < per_step and self.drop_last:
                break
            mine = chunk[rank * self.examples_per_batch : (rank + 1) * self.examples_per_batch]
            batches.append((position + len(chunk), mine))
        return batches

    def __iter__(self):
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        index_batches = self._index_batches(start)
        self._sampler.batches = [mine for _, mine in index_batches]
        self.sample_in_epoch = start
        for batch, (end, _) in zip(self.dataloader, index_batches):  # the loader first: it ends its own epoch
            self.sample_in_epoch = end
            yield batch
        self.epoch += 1
        self.sample_in_epoch = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch, "shuffle_seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.sample_in_epoch = int(state["sample_in_epoch"])
        self._resume_from = self.sample_in_epoch


class _EpochBatchSampler(torch.utils.data.Sampler):
    """The index batches of the epoch being iterated (set by FinetuningLoader before each epoch)."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(list(self.batches))


@dataloaders.register("finetuning", config=FinetuningLoaderSettings)
def build_finetuning_dataloader(settings: FinetuningLoaderSettings, tokenizer, device_batch_size: int, *,
                                key: str = "train_loader"):
    from llmfoundry.data.streaming_guard import import_streaming

    ds = settings.dataset
    if tokenizer is None or tokenizer.eos_token_id is None:
        raise ConfigError("tokenizer.name: the finetuning loader needs a tokenizer with an EOS token")
    if ds.max_seq_len <= 0:
        raise ConfigError(f"{key}.dataset.max_seq_len: expected a positive int, got {ds.max_seq_len}")
    pad = ds.pad_token_id
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    mds = ds.remote is not None or ds.local is not None or ds.streams
    if mds and ds.hf_name:
        raise ConfigError(f"{key}.dataset: set hf_name or remote/local/streams, not both")
    ratio = ds.packing_ratio
    if ratio is not None and not ds.decoder_only_format:
        raise ConfigError(f"{key}.dataset.packing_ratio: packing needs decoder_only_format: true")
    if not ds.decoder_only_format and (ds.target_prompts != "none" or ds.target_responses != "last"):
        raise ConfigError(f"{key}.dataset.decoder_only_format: false makes the last response the labels; leave "
                          "target_prompts none and target_responses last")
    if mds:
        if ratio == "auto":
            raise ConfigError(f"{key}.dataset.packing_ratio: 'auto' needs hf_name data; set a number for MDS data")
        per_batch = device_batch_size if ratio is None else max(device_batch_size, math.ceil(device_batch_size * float(ratio)))
        dataset = make_streaming_dataset(_mds_dataset_class(), ds, per_batch, f"{key}.dataset")
        collator = FinetuningCollator(ds, pad, device_batch_size, packing=ratio is not None)
        return import_streaming().StreamingDataLoader(dataset, batch_size=per_batch, collate_fn=collator,
                                                      **dataloader_kwargs(settings, key))
    dataset = FinetuningDataset(tokenizer, ds, f"{key}.dataset")
    collator = FinetuningCollator(ds, pad, device_batch_size, packing=ratio is not None)
    loader = FinetuningLoader(dataset, collator, device_batch_size, settings, key)
    if ratio == "auto":
        order = loader._order(0)
        ratio = auto_packing_ratio([len(dataset.examples[i]["input_ids"]) for i in order], ds.max_seq_len,
                                   device_batch_size)
        print(f"{key}.dataset.packing_ratio: auto chose {ratio}", flush=True)
    if ratio is not None and float(ratio) < 1:
        raise ConfigError(f"{key}.dataset.packing_ratio: expected >= 1 (examples per row), got {ratio}")
    if ratio is not None:
        loader.examples_per_batch = max(device_batch_size, math.ceil(device_batch_size * float(ratio)))
    loader.packing_ratio = ratio
    return loader
