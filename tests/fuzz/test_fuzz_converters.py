"""Broken input files through the converters' command lines (``llmfoundry data json|finetuning|text``, the same
code as data_prep/*.py): JSONL that is not JSON, records with wrong or missing fields, empty and huge lines,
non-UTF-8 bytes. Each run ends with exit 0 or a one-line error with exit 2, never a traceback."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import assert_clean_exit, fuzz_settings, run_cli
from tests.fuzz.strategies import ODD_STRINGS, values

_runs = itertools.count()

# one line of a JSONL file: a good record, a record with odd fields, or something that is not one JSON object
good_text = st.text(min_size=1, max_size=80)
record = st.one_of(
    st.fixed_dictionaries({"text": good_text}),
    st.fixed_dictionaries({"prompt": good_text, "response": good_text}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "", "x"]), "content": values}), max_size=4)}),
    st.dictionaries(st.sampled_from(["text", "prompt", "response", "messages", "turns", "context", "other"]), values,
                    max_size=3),
)
line = st.one_of(
    record.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    values.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),  # not an object
    st.sampled_from([b"", b" ", b"{", b"}", b"[", b'{"text": ', b'{"text": "a"', b"null", b"\xff\xfe", b"\xc3(",
                     b'{"text": "\xff"}', b"\x00\x00", b'{"text": "' + b"x" * 200_000 + b'"}', b"x" * 100_000]),
    st.sampled_from(ODD_STRINGS).map(lambda s: s.encode("utf-8", "surrogatepass")),
)
jsonl = st.lists(line, max_size=6).map(lambda lines: b"\n".join(lines))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-converters")


def _fresh(workdir):
    run = workdir / f"run{next(_runs)}"
    run.mkdir()
    return run


@fuzz_settings(ci_examples=40)
@given(content=jsonl, concat=st.sampled_from([None, 8]))
def test_json_converter_on_broken_jsonl_exits_cleanly(workdir, tokenizer_dir, content, concat):
    run = _fresh(workdir)
    (run / "in.jsonl").write_bytes(content)
    argv = ["data", "json", "--path", str(run / "in.jsonl"), "--out_root", str(run / "out"), "--num_workers", "1",
            "--compression", "none", "--quiet"]
    if concat is not None:
        argv += ["--concat_tokens", str(concat), "--tokenizer", str(tokenizer_dir)]
    assert_clean_exit(*run_cli(argv), f"json converter on {content[:300]!r}")


@fuzz_settings(ci_examples=40)
@given(content=jsonl, preprocessor=st.sampled_from([None, None, "no_such_module:fn"]))
def test_finetuning_converter_on_broken_jsonl_exits_cleanly(workdir, tokenizer_dir, content, preprocessor):
    run = _fresh(workdir)
    (run / "train.jsonl").write_bytes(content)
    argv = ["data", "finetuning", "--dataset", str(run / "train.jsonl"), "--out_root", str(run / "out"),
            "--tokenizer", str(tokenizer_dir), "--max_seq_len", "32", "--num_workers", "1", "--compression", "none"]
    if preprocessor:
        argv += ["--preprocessor", preprocessor]
    assert_clean_exit(*run_cli(argv), f"finetuning converter on {content[:300]!r}")


@fuzz_settings(ci_examples=25)
@given(files=st.lists(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                                st.sampled_from([b"", b"\xff\xfe\x00", b"a" * 100_000])), max_size=4))
def test_text_converter_on_odd_files_exits_cleanly(workdir, tokenizer_dir, files):
    run = _fresh(workdir)
    source = run / "in"
    source.mkdir()
    for i, content in enumerate(files):
        (source / f"doc{i}.txt").write_bytes(content)
    argv = ["data", "text", "--input_folder", str(source), "--output_folder", str(run / "out"), "--concat_tokens",
            "8", "--tokenizer", str(tokenizer_dir), "--processes", "1", "--compression", "none", "--quiet"]
    assert_clean_exit(*run_cli(argv), f"text converter on {[f[:50] for f in files]!r}")
