"""``dataset.preprocessing_fn``: what turns a raw finetuning record into a prompt/response or chat example.

As in llm-foundry, ``preprocessing_fn`` is one of:

- unset: the preprocessor registered under the dataset's ``hf_name`` (below: llm-foundry's built-ins for the hub
  datasets its recipes name), else none (records are already ``{prompt, response}`` or ``{messages}``);
- a registered name (``tatsu-lab/alpaca``, or one a plugin registers in ``registry.preprocessors``);
- ``module:function`` (or ``path/to/file.py:function``): a function of one record returning an example;
- a column mapping ``{prompt: COLUMN, response: COLUMN}``: the record's COLUMN values become prompt and response.

A preprocessor that cannot format a record raises ``PreprocessingError`` (or KeyError/TypeError/ValueError); the
caller turns that into a one-line error naming the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.sources import callable_from_spec
from llmfoundry.registry import preprocessors

COLUMN_MAPPING_KEYS = ("prompt", "response")
# The prompt template llm-foundry's dolly_15k preprocessor formats instructions with (the same text, for the same
# tokens).
DOLLY_PROMPT = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
                "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
ALPACA_RESPONSE_MARK = "### Response:"
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}  # other roles (system, tool) keep their name


class PreprocessingError(ValueError):
    """A record that a preprocessor cannot format (the message says what is missing)."""


def _field(record: dict, name: str) -> Any:
    if name not in record:
        raise PreprocessingError(f"missing field '{name}' (the record has {', '.join(sorted(record)) or 'no fields'})")
    return record[name]


@preprocessors.register("tatsu-lab/alpaca")
def alpaca(record: dict) -> dict[str, str]:
    """``text`` holds instruction and answer: the prompt runs through '### Response:', the rest is the response."""
    parts = str(_field(record, "text")).split(ALPACA_RESPONSE_MARK)
    if len(parts) != 2:
        raise PreprocessingError(f"field 'text' must contain '{ALPACA_RESPONSE_MARK}' exactly once "
                                 f"(found {len(parts) - 1})")
    return {"prompt": parts[0] + ALPACA_RESPONSE_MARK, "response": parts[1]}


@preprocessors.register("HuggingFaceH4/databricks_dolly_15k")
def dolly_15k(record: dict) -> dict[str, str]:
    """``instruction`` (+ newline + ``input`` when non-empty) in the Alpaca-style prompt; ``output`` is the response."""
    instruction, context = _field(record, "instruction"), _field(record, "input")
    if context != "":
        instruction = f"{instruction}\n{context}"
    return {"prompt": DOLLY_PROMPT.format(instruction=instruction), "response": _field(record, "output")}


@preprocessors.register("bigscience/P3")
def p3(record: dict) -> dict[str, str]:
    """``inputs`` followed by ':' is the prompt, ``targets`` the response."""
    return {"prompt": _field(record, "inputs") + ":", "response": _field(record, "targets")}


def _inputs_targets_spaced(record: dict) -> dict[str, str]:
    """``inputs``/``targets``, with a space put before the response when neither side has whitespace at the seam."""
    prompt, response = _field(record, "inputs"), _field(record, "targets")
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise PreprocessingError("fields 'inputs' and 'targets' must be strings")
    seams = (" ", "\n", "\t")
    if not prompt.endswith(seams) and not response.startswith(seams):
        response = " " + response
    return {"prompt": prompt, "response": response}


preprocessors.register("Muennighoff/P3")(_inputs_targets_spaced)
preprocessors.register("Muennighoff/flan")(_inputs_targets_spaced)


@preprocessors.register("teknium/OpenHermes-2.5")
def sharegpt(record: dict) -> dict[str, list[dict[str, str]]]:
    """ShareGPT ``conversations`` ({from, value}) as chat messages: human -> user, gpt -> assistant."""
    conversation = _field(record, "conversations")
    if not isinstance(conversation, list):
        raise PreprocessingError(f"field 'conversations' must be a list, got {type(conversation).__name__}")
    messages = []
    for turn in conversation:
        if not isinstance(turn, dict):
            raise PreprocessingError(f"each conversation turn must be an object, got {type(turn).__name__}")
        speaker = _field(turn, "from")
        messages.append({"role": SHAREGPT_ROLES.get(speaker, speaker), "content": _field(turn, "value")})
    return {"messages": messages}


@preprocessors.register("math-ai/StackMathQA")
def question_answer(record: dict) -> dict[str, list[dict[str, str]]]:
    """``Q`` and ``A`` as one user and one assistant message."""
    return {"messages": [{"role": "user", "content": _field(record, "Q")},
                         {"role": "assistant", "content": _field(record, "A")}]}


@preprocessors.register("AI-MO/NuminaMath-CoT")
def messages_only(record: dict) -> dict[str, Any]:
    """The record's ``messages`` (its other fields, such as problem and solution, are left out)."""
    return {"messages": _field(record, "messages")}


def column_mapping(mapping: dict[str, str]) -> Callable[[dict], dict[str, Any]]:
    """A preprocessor taking prompt and response from the record's columns ``mapping['prompt']`` / ``['response']``."""
    prompt_column, response_column = mapping["prompt"], mapping["response"]

    def from_columns(record: dict) -> dict[str, Any]:
        return {"prompt": _field(record, prompt_column), "response": _field(record, response_column)}

    return from_columns


def column_mapping_problems(mapping: dict, key: str) -> list[str]:
    """What is wrong with a ``{prompt: COLUMN, response: COLUMN}`` mapping under ``key``."""
    if sorted(mapping) != sorted(COLUMN_MAPPING_KEYS) or not all(isinstance(v, str) for v in mapping.values()):
        return [(f"{key}: a column mapping needs exactly the keys prompt and response, each naming a column "
                 f"(got {mapping}); e.g. {{prompt: question, response: answer}}")]
    return []


def resolve_preprocessor(spec: str | dict | None, hf_name: str | None, key: str) -> Callable[[dict], Any] | None:
    """The preprocessor for ``dataset.preprocessing_fn`` = ``spec`` (see the module docstring); None for none."""
    if isinstance(spec, dict):
        problems = column_mapping_problems(spec, key)
        if problems:
            raise ConfigError(problems[0])
        return column_mapping(spec)
    if spec is None:
        return preprocessors.get(hf_name).builder if hf_name and hf_name in preprocessors else None
    if spec in preprocessors:
        return preprocessors.get(spec).builder
    if ":" not in spec:
        raise ConfigError(f"{key}: '{spec}' is neither a registered preprocessor ({', '.join(preprocessors.names())}) "
                          "nor 'module:function'")
    return callable_from_spec(spec, key)


def describe_preprocessor(spec: str | dict | None, hf_name: str | None) -> str:
    """How the records of ``hf_name`` are formatted, for error messages."""
    if isinstance(spec, dict):
        return f"the column mapping {spec}"
    if spec is None:
        return f"the preprocessor registered for '{hf_name}'"
    return f"preprocessing_fn '{spec}'"
