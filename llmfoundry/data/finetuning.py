"""Finetuning examples: prompt/response or chat records -> tokenized ``input_ids``/``labels``. The loader
(finetuning_loader.py) batches these examples; the converter (prep/finetuning.py) writes them as MDS, so both
tokenize, target and truncate alike. The loader's settings are in loader_settings.py.

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
        preprocessing_fn: null            # unset: the one registered for hf_name (e.g. tatsu-lab/alpaca), if any
        safe_load: false                  # true: only .csv/.json/.jsonl/.parquet files are read
        shuffle: true
      drop_last: true

An example is ``{"prompt": ..., "response": ...}`` (or ``completion``), or ``{"messages": [{"role": ..., "content":
...}, ...]}`` with roles system/user/assistant/tool, formatted with the tokenizer's chat template (ChatML when it
has none); each assistant message ends a turn. Labels are -100 except on targets. An example longer than
``max_seq_len`` is truncated; one left with no target is dropped (counted in ``dataset.num_dropped`` and
reported). MDS data written by ``convert_finetuning_dataset.py`` (tokenized ``input_ids``/``labels``) is read with
``remote``/``local``/``streams`` instead of ``hf_name``.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.data.loader_settings import FinetuningDatasetSettings, prompt_target_length
from llmfoundry.data.preprocessors import PreprocessingError, describe_preprocessor, resolve_preprocessor
from llmfoundry.data.safe_load import check_files, check_folder, safe_dataset_folder
from llmfoundry.data.sources import iter_records, load_hf_split, mp_context
from llmfoundry.data.text import IGNORE_INDEX

log = logging.getLogger(__name__)

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool")


# ----------------------------------------------------------------------------------------------- reading examples
def load_raw_examples(ds: FinetuningDatasetSettings, key: str) -> list[tuple[str, dict]]:
    """(where, raw example) pairs of the configured split; ``where`` names file and line for error messages."""
    name, split = ds.hf_name, ds.split or "train"
    data_files = ds.hf_kwargs.get("data_files")
    if ds.safe_load:
        name = _safely_loadable(ds, key)
    if name is not None and objectstore.is_remote(name):
        path = objectstore.join(name, f"{split}.jsonl")
        if objectstore.read_bytes(path) is None:
            raise ConfigError(f"{key}.hf_name: '{path}' does not exist (the remote folder needs {split}.jsonl)")
        records = list(iter_records(path))
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
            records += iter_records(file)
    elif name is not None and name.endswith((".jsonl", ".json")) and os.path.isfile(name):
        records = list(iter_records(name))
    elif name is not None:
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


def _safely_loadable(ds: FinetuningDatasetSettings, key: str) -> str | None:
    """``hf_name`` when safe_load allows reading it (for a hub id: the folder its plain data files were downloaded
    to); a one-line error naming the first file of another type otherwise."""
    name = ds.hf_name
    data_files = ds.hf_kwargs.get("data_files")
    if data_files is not None:
        values = data_files.values() if isinstance(data_files, dict) else [data_files]
        check_files([f for value in values for f in ([value] if isinstance(value, str) else value)], key)
    if name is None or objectstore.is_remote(name) or (name.endswith((".jsonl", ".json")) and os.path.isfile(name)):
        return name  # read by our own JSON reader
    if name in ("json", "csv", "parquet"):  # a file-type builder: only its data files and data_dir are read
        if ds.hf_kwargs.get("data_dir"):
            check_folder(str(ds.hf_kwargs["data_dir"]), key)
        return name
    return safe_dataset_folder(name, ds.hf_kwargs, key)


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


def build_example(turns, ds: FinetuningDatasetSettings, key: str) -> dict[str, list[int]] | None:
    """input_ids and labels of one example, truncated to max_seq_len; None when no target token is left."""
    input_ids: list[int] = []
    labels: list[int] = []
    for i, (prompt, response) in enumerate(turns):
        last = i == len(turns) - 1
        prompt_target = len(prompt) >= prompt_target_length(ds.target_prompts, key)
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
    """decoder_only_format false: the context is input_ids, the last response (ending with EOS) is labels. As
    llm-foundry's Seq2SeqFinetuningCollator, each is cut to its first max_seq_len - 1 tokens plus EOS when longer;
    an example with an empty context or response is dropped (its is_valid_ift_example)."""
    context = [t for prompt, response in turns[:-1] for t in prompt + response] + turns[-1][0]
    response = turns[-1][1]
    if not context or not response:
        return None
    eos = response[-1]  # tokenize_example ends the last response with the tokenizer's EOS
    keep = ds.max_seq_len - 1
    input_ids = context if len(context) <= ds.max_seq_len else context[:keep] + [eos]
    labels = response if len(response) <= ds.max_seq_len else response[:keep] + [eos]
    return {"input_ids": input_ids, "labels": labels}


def record_preprocessor(ds: FinetuningDatasetSettings, key: str, preprocess_records: bool = True):
    """The function formatting each record (llm-foundry's choice: see preprocessors.py), or None."""
    if not preprocess_records:
        return None
    return resolve_preprocessor(ds.preprocessing_fn, ds.hf_name, f"{key}.preprocessing_fn")


def _preprocessed(preprocess, raw: dict, ds: FinetuningDatasetSettings, where: str) -> dict:
    try:
        example = preprocess(raw)
    except (PreprocessingError, KeyError, TypeError, ValueError) as error:
        why = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ConfigError(f"{where}: {describe_preprocessor(ds.preprocessing_fn, ds.hf_name)} cannot format this "
                          f"record ({why}); set dataset.preprocessing_fn to one that fits these records") from None
    if not isinstance(example, dict):
        raise ConfigError(f"{where}: {describe_preprocessor(ds.preprocessing_fn, ds.hf_name)} returned "
                          f"{type(example).__name__}, expected a dict")
    return example


def _build_examples(tokenizer, ds: FinetuningDatasetSettings, key: str, preprocess, items) -> list[dict | None]:
    """Tokenized examples of ``(where, raw)`` items, in order; None for one truncated to no target."""
    out: list[dict[str, list[int]] | None] = []
    for where, raw in items:
        if preprocess is not None:
            raw = _preprocessed(preprocess, raw, ds, where)
        turns = tokenize_example(tokenizer, raw, where)
        out.append(build_example(turns, ds, key) if ds.decoder_only_format else build_encdec_example(turns, ds))
    return out


_worker_state: tuple | None = None


def _init_example_worker(tokenizer, ds: FinetuningDatasetSettings, key: str, preprocess_records: bool) -> None:
    global _worker_state
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    # the preprocessor is imported in each worker
    _worker_state = (tokenizer, ds, key, record_preprocessor(ds, key, preprocess_records))


def _build_examples_in_worker(items) -> list[dict | None]:
    assert _worker_state is not None
    return _build_examples(*_worker_state, items)


def build_examples_in_this_process(tokenizer, ds: FinetuningDatasetSettings, key: str, preprocess_records: bool,
                                   items) -> list[dict | None]:
    """``_build_examples`` for a long-lived worker process (a Ray task's) that is handed the same settings object
    again and again: the preprocessor is imported once per process and settings object, not once per call."""
    if _worker_state is None or _worker_state[1] is not ds:
        _init_example_worker(tokenizer, ds, key, preprocess_records)
    return _build_examples_in_worker(items)


class FinetuningDataset(torch.utils.data.Dataset):
    """Tokenized examples in memory; ``num_dropped`` counts examples truncated to nothing to learn.

    ``num_workers > 1`` tokenizes chunks of examples in that many processes; the examples (and their order) are
    the same as with one.
    """

    def __init__(self, tokenizer, ds: FinetuningDatasetSettings, key: str, *, num_workers: int = 1,
                 preprocess_records: bool = True):
        if ds.eos_token_id is not None and ds.eos_token_id != tokenizer.eos_token_id:
            notice_once(f"{key}.eos_token_id: {ds.eos_token_id} is not the tokenizer's EOS id "
                        f"{tokenizer.eos_token_id}; responses end with the tokenizer's EOS, as in llm-foundry "
                        "(which ignores this key for finetuning data)")
        preprocess = record_preprocessor(ds, key, preprocess_records)
        raw = load_raw_examples(ds, key)
        if num_workers > 1 and len(raw) > 1:
            per_chunk = max(1, min(1000, math.ceil(len(raw) / (num_workers * 4))))
            chunks = [raw[i : i + per_chunk] for i in range(0, len(raw), per_chunk)]
            with mp_context().Pool(min(num_workers, len(chunks)), initializer=_init_example_worker,
                                   initargs=(tokenizer, ds, key, preprocess_records)) as pool:
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
