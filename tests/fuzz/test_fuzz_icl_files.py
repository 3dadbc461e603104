"""Broken ICL task files through the path every evaluation takes to read them (``ICLEvaluator`` reads the file and
builds every prompt before any model runs): the evaluator is built, or a ConfigError with one line per problem
is raised; never another exception."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.runner import ICLEvaluator
from tests.fuzz.fuzzing import fuzz_settings
from tests.fuzz.strategies import ODD_STRINGS, values

_files = itertools.count()
TASK_TYPES = ["language_modeling", "multiple_choice", "schema", "generation_task_with_answers"]
FIELDS = ["context", "continuation", "query", "choices", "gold", "context_options", "answer", "aliases", "category"]

text = st.one_of(st.text(max_size=60), st.sampled_from(ODD_STRINGS))
field_value = st.one_of(text, values, st.lists(text, max_size=4), st.integers(-3, 6))
plausible = st.one_of(
    st.fixed_dictionaries({"context": text, "continuation": text}),
    st.fixed_dictionaries({"query": text, "choices": st.lists(text, max_size=5), "gold": st.integers(-2, 6)}),
    st.fixed_dictionaries({"context_options": st.lists(text, max_size=4), "continuation": text,
                           "gold": st.integers(-2, 5)}),
    st.fixed_dictionaries({"context": text, "answer": text, "aliases": st.one_of(st.lists(text, max_size=3), text)}),
)
record = st.one_of(plausible, st.dictionaries(st.sampled_from(FIELDS), field_value, max_size=4))
line = st.one_of(
    record.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"{", b"[1]", b"null", b"\xff", b'{"context": "\xc3("}', b"x" * 50_000]),
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-icl")


@fuzz_settings(ci_examples=60)
@given(lines=st.lists(line, max_size=6), task_type=st.sampled_from(TASK_TYPES),
       num_fewshot=st.sampled_from([0, 1, 3]), seq_len=st.sampled_from([1, 8, 64]),
       options=st.dictionaries(st.sampled_from(["continuation_delimiter", "example_delimiter", "prompt_string",
                                                "question_prelimiter"]), text, max_size=2),
       categories=st.booleans())
def test_a_broken_task_file_is_read_or_refused_with_a_config_error(workdir, tokenizer, lines, task_type, num_fewshot,
                                                                  seq_len, options, categories):
    path = workdir / f"task{next(_files)}.jsonl"
    path.write_bytes(b"\n".join(lines))
    task = {"label": "fuzz", "dataset_uri": str(path), "icl_task_type": task_type, "num_fewshot": [num_fewshot],
            "max_seq_len": seq_len, "has_categories": categories, **options}
    try:
        ICLEvaluator([task], tokenizer, batch_size=4, max_seq_len=seq_len)
    except ConfigError as error:
        first, *rest = str(error).split("\n")
        assert first and all(line.startswith("  - ") for line in rest), f"not one line per problem: {error}"
