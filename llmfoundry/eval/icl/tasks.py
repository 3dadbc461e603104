"""ICL task types: how a record of a task file becomes token sequences to score, with llm-foundry's prompt rules.

Prompt rules (shared by all task types):

* The *preamble* is ``prompt_string`` followed by ``num_fewshot`` solved examples, picked for each test example
  by one ``random.Random(fewshot_random_seed)`` that walks the file in order; the example itself is never among
  its own shots. A shot is ``[example_delimiter] + question_prelimiter + context + continuation_delimiter +
  answer``; the delimiter is left out only when nothing precedes the shot.
* The preamble is tokenized with the tokenizer's special tokens (e.g. a BOS token; a trailing EOS is dropped);
  the test example's own context is tokenized without them, after ``rstrip()`` when ``strip_dataset`` is on.
* Answers get a leading space when the tokenizer is GPT-2-like (``' a'`` is one token) and have none.
* A context too long for ``max_seq_len`` loses tokens on the left; the answer is always kept whole.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import ICLTaskConfig
from llmfoundry.registry import icl_task_types

# llm-foundry gives generation tasks with a chain of thought this many extra tokens beyond the longest answer.
ANSWER_BUFFER_TOKENS = 10


@dataclass
class Sequence:
    """One sequence to score: ``tokens[cont_start:]`` is the continuation whose log-likelihood is measured."""

    tokens: list[int]
    cont_start: int

    @property
    def continuation(self) -> list[int]:
        return self.tokens[self.cont_start :]


@dataclass
class Example:
    """One test example, ready for the model."""

    index: int  # line of the record in the task file (0-based, after blank lines are dropped)
    sequences: list[Sequence] = field(default_factory=list)  # scored tasks: one per choice (LM: one)
    gold: int | None = None
    choice_texts: list[str] = field(default_factory=list)  # for acc_norm: lengths of these strings
    category: str | None = None
    prompt: list[int] | None = None  # generation tasks: the prompt tokens
    answers: list[str] = field(default_factory=list)  # generation tasks: acceptable answers
    text: str = ""  # the prompt as text (preamble + context), for inspection


def encode(tokenizer, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def needs_prefix_space(tokenizer) -> bool:
    """GPT-2-style BPE tokenizers encode ' a' as one token and need a space before an answer; SentencePiece not."""
    return len(encode(tokenizer, " a", False)) == 1


def fewshot_indices(num_records: int, num_fewshot: int, example_idx: int, rng: random.Random) -> set[int]:
    """Shots for one example: sampled without replacement, never the example itself (llm-foundry's algorithm, so
    that the same seed picks the same shots; the result is a set and is iterated in set order)."""
    num_fewshot = min(num_records - 1, num_fewshot)
    picked = set(rng.sample(range(num_records), num_fewshot))
    if example_idx in picked:
        picked.remove(example_idx)
        if len(picked) >= num_records - 1:
            return picked
        replacement = rng.choice(range(num_records))
        while replacement in picked or replacement == example_idx:
            replacement = rng.choice(range(num_records))
        picked.add(replacement)
    return picked


def _choices_problem(record: dict, key: str) -> str | None:
    """Why ``record[key]`` (the choices) and ``record["gold"]`` (an index into them) cannot be scored, or None."""
    choices, gold = record[key], record["gold"]
    if not isinstance(choices, list) or not choices:
        return f"{key} must be a non-empty list, got {choices!r:.60}"
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
        return f"gold must be an index into {key} (0 to {len(choices) - 1}), got {gold!r:.60}"
    return None


def trim_left(context: list[int], continuation: list[int], max_len: int, label: str) -> list[int]:
    if len(context) + len(continuation) <= max_len:
        return context
    room = max_len - len(continuation)
    if room < 0:
        raise ConfigError(
            f"icl_tasks: {label}: an answer of {len(continuation)} tokens is longer than max_seq_len={max_len}"
        )
    return context[len(context) - room :] if room > 0 else []


class ICLTask:
    """Base task type: context/answer records (``context`` + ``continuation`` or ``answer``).

    A task type is a subclass of ICLTask registered under the ``icl_task_type`` name that selects it
    (``@registry.icl_task_types.register("my_type")``, e.g. from a file in a recipe's ``code_paths``). The
    evaluator makes one instance per (task, num_fewshot) as ``cls(cfg, tokenizer, max_seq_len)`` and calls
    ``prepare(records, num_fewshot)``, which returns one ``Example`` per record, in file order, with ``index``
    set to the record's position; a ``Sequence`` with no context gets the BOS (or EOS) token put in front.
    The class attribute ``scoring`` says what each Example holds and which metrics the task reports:

    * ``"greedy"``: one Sequence; correct when every continuation token is the model's argmax (accuracy, acc);
    * ``"choices"``: one Sequence per choice, the ``gold`` index and ``choice_texts``; every choice rule in
      ``registry.metrics`` picks a choice and is correct when it picks gold (one metric per rule);
    * ``"generation"``: the ``prompt`` tokens and acceptable ``answers``; the task sets ``max_new_tokens`` in
      ``prepare``; the greedy generation, cut at ``early_stopping_criteria``, must start with an answer (accuracy).

    A new record format usually subclasses the built-in type it scores like and overrides ``required_keys`` and
    ``build(record, preamble) -> Example`` (and ``context``/``answer`` for how its few-shot examples read).
    """

    scoring = "greedy"
    context_key = "context"
    answer_key = "continuation"
    required_keys: tuple[str, ...] = ("context", "continuation")

    def __init__(self, cfg: ICLTaskConfig, tokenizer, max_seq_len: int):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.prefix_space = needs_prefix_space(tokenizer)

    # --- text -----------------------------------------------------------------------------------------------
    def spaced(self, text: str) -> str:
        """``text`` with the leading space that a GPT-2-like tokenizer needs before an answer."""
        return " " + text if self.prefix_space and not text.startswith(" ") else text

    def answer(self, record: dict[str, Any], in_context: bool) -> str:
        answer = str(record[self.answer_key])
        return answer if in_context else self.spaced(answer)

    def context(self, record: dict[str, Any], preceding: str, add_answer: bool) -> str:
        text = self.cfg.question_prelimiter + str(record[self.context_key])
        if preceding:
            text = self.cfg.example_delimiter + text
        text += self.cfg.continuation_delimiter
        if add_answer:
            text += self.answer(record, in_context=True)
        return text

    def preamble(self, records: list[dict], idx: int, num_fewshot: int, rng: random.Random) -> str:
        text = self.cfg.prompt_string
        if num_fewshot > 0:
            for shot in fewshot_indices(len(records), num_fewshot, idx, rng):
                text += self.context(records[shot], text, add_answer=True)
        return text

    def encode_preamble(self, preamble: str) -> list[int]:
        tokens = encode(self.tokenizer, preamble, True)
        eos = self.tokenizer.eos_token_id
        if eos is not None and len(tokens) > 1 and tokens[-1] == eos:
            tokens = tokens[:-1]
        return tokens

    def encode_context(self, context: str) -> list[int]:
        if self.cfg.strip_dataset:
            context = context.rstrip()
        return encode(self.tokenizer, context, False)

    # --- records -> examples --------------------------------------------------------------------------------
    def check(self, records: list[dict]) -> None:
        for i, record in enumerate(records):
            missing = [k for k in self.required_keys if k not in record]
            if missing:
                raise ConfigError(
                    f"icl_tasks: {self.cfg.label}: record {i} of {self.cfg.dataset_uri} lacks "
                    f"{', '.join(missing)} (a {self.cfg.icl_task_type} record has {', '.join(self.required_keys)})"
                )
            problem = self.record_problem(record)
            if problem:
                raise ConfigError(f"icl_tasks: {self.cfg.label}: record {i} of {self.cfg.dataset_uri}: {problem}")

    def record_problem(self, record: dict) -> str | None:
        """What makes a record that has every required key unusable (a task type with lists and indices checks
        them here), or None."""
        return None

    def prepare(self, records: list[dict], num_fewshot: int) -> list[Example]:
        """All examples of the task, in file order (the few-shot RNG must see every record in order)."""
        self.check(records)
        rng = random.Random(self.cfg.fewshot_random_seed)
        examples = []
        for idx, record in enumerate(records):
            preamble = self.preamble(records, idx, num_fewshot, rng)
            example = self.build(record, preamble)
            example.index = idx
            if self.cfg.has_categories:
                example.category = str(record.get("category", "unknown"))
            examples.append(example)
        return examples

    def build(self, record: dict, preamble: str) -> Example:
        context = self.context(record, preamble, add_answer=False)
        tokens = self.encode_preamble(preamble) + self.encode_context(context)
        cont = encode(self.tokenizer, self.answer(record, in_context=False), False)
        tokens = trim_left(tokens, cont, self.max_seq_len, self.cfg.label)
        return Example(index=-1, sequences=[Sequence(tokens + cont, len(tokens))], text=preamble + context)


@icl_task_types.register("language_modeling")
class LanguageModelingTask(ICLTask):
    """``context`` + ``continuation``; correct when greedy decoding reproduces every continuation token."""


@icl_task_types.register("multiple_choice")
class MultipleChoiceTask(ICLTask):
    """``query`` + ``choices`` + ``gold``; every choice is scored as a continuation of the same context."""

    scoring = "choices"
    context_key = "query"
    required_keys = ("query", "choices", "gold")

    def answer(self, record: dict[str, Any], in_context: bool) -> str:
        return str(record["choices"][record["gold"]])

    def record_problem(self, record: dict) -> str | None:
        return _choices_problem(record, "choices")

    def build(self, record: dict, preamble: str) -> Example:
        context = self.context(record, preamble, add_answer=False)
        ctx_tokens = self.encode_preamble(preamble) + self.encode_context(context)
        sequences = []
        for choice in record["choices"]:
            cont = encode(self.tokenizer, self.spaced(str(choice)), False)
            tokens = trim_left(ctx_tokens, cont, self.max_seq_len, self.cfg.label)
            sequences.append(Sequence(tokens + cont, len(tokens)))
        return Example(
            index=-1,
            sequences=sequences,
            gold=int(record["gold"]),
            choice_texts=[str(c) for c in record["choices"]],
            text=preamble + context,
        )


@icl_task_types.register("schema")
class SchemaTask(ICLTask):
    """``context_options`` + ``continuation`` + ``gold``: the shared continuation is scored after each context
    (partial scoring, Trinh & Le 2018)."""

    scoring = "choices"
    required_keys = ("context_options", "continuation", "gold")

    def record_problem(self, record: dict) -> str | None:
        return _choices_problem(record, "context_options")

    def context(self, record: dict[str, Any], preceding: str, add_answer: bool) -> str:
        # A solved shot: the gold context and the continuation (llm-foundry puts the prelimiter first).
        text = str(record["context_options"][record["gold"]])
        if preceding:
            text = self.cfg.example_delimiter + text
        return f"{self.cfg.question_prelimiter}{text}{self.cfg.continuation_delimiter}{record['continuation']}"

    def options(self, record: dict, preamble: str) -> list[str]:
        pre, delim = self.cfg.question_prelimiter, self.cfg.continuation_delimiter
        if preamble:
            if self.cfg.strip_dataset:
                delim = delim.rstrip()
            return [f"{pre}{self.cfg.example_delimiter}{c}{delim}" for c in record["context_options"]]
        return [f"{pre}{c}" for c in record["context_options"]]

    def build(self, record: dict, preamble: str) -> Example:
        pre_tokens = self.encode_preamble(preamble)
        cont = encode(self.tokenizer, self.answer(record, in_context=False), False)
        sequences = []
        options = self.options(record, preamble)
        for option in options:
            tokens = trim_left(pre_tokens + encode(self.tokenizer, option, False), cont, self.max_seq_len, self.cfg.label)
            sequences.append(Sequence(tokens + cont, len(tokens)))
        return Example(
            index=-1,
            sequences=sequences,
            gold=int(record["gold"]),
            choice_texts=[str(c) for c in record["context_options"]],
            text=preamble + options[int(record["gold"])],
        )


@icl_task_types.register("generation_task_with_answers")
class GenerationTask(ICLTask):
    """``context`` + ``answer`` (+ ``aliases``, ``chain_of_thought``): greedy generation, cut at the stop strings
    and after the last ``cot_delimiter``; correct when it starts with an acceptable answer (after normalisation)."""

    scoring = "generation"
    answer_key = "answer"
    required_keys = ("context", "answer")

    def answer(self, record: dict[str, Any], in_context: bool) -> str:
        if self.has_cot:
            return f"{record.get('chain_of_thought', '')}{self.cfg.cot_delimiter}{record['answer']}"
        return str(record["answer"])

    def record_problem(self, record: dict) -> str | None:
        if not isinstance(record.get("aliases", []), list):
            return f"aliases must be a list of answers, got {type(record['aliases']).__name__}"
        return None

    def prepare(self, records: list[dict], num_fewshot: int) -> list[Example]:
        self.check(records)
        self.has_cot = "chain_of_thought" in records[0]
        longest = 0
        for record in records:
            for answer in [record["answer"], *record.get("aliases", [])]:
                response = f"{record.get('chain_of_thought', '')}{self.cfg.cot_delimiter}{answer}" if self.has_cot else str(answer)
                longest = max(longest, len(encode(self.tokenizer, response, True)))
        self.max_answer_length = longest + (ANSWER_BUFFER_TOKENS if self.cfg.cot_delimiter else 0)
        self.max_new_tokens = int(self.cfg.generation_kwargs.get("max_new_tokens", max(self.max_answer_length, 1)))
        self.prompt_room = max(self.max_seq_len - self.max_answer_length, 1)
        return super().prepare(records, num_fewshot)

    def build(self, record: dict, preamble: str) -> Example:
        context = self.context(record, preamble, add_answer=False)
        tokens = self.encode_preamble(preamble) + self.encode_context(context)
        tokens = trim_left(tokens, [], self.prompt_room, self.cfg.label)
        answers = list(dict.fromkeys([str(record["answer"]), *map(str, record.get("aliases", []))]))
        return Example(index=-1, prompt=tokens, answers=answers, text=preamble + context)


def build_task(cfg: ICLTaskConfig, tokenizer, max_seq_len: int) -> ICLTask:
    entry = icl_task_types.get(cfg.icl_task_type, key=f"icl_tasks.{cfg.label}.icl_task_type")
    return entry.builder(cfg, tokenizer, max_seq_len)
