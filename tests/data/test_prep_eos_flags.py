"""convert_text_to_mds's ``--use_tokenizer_eos`` (llm-foundry's flag) and how --eos_text defaults here."""

from __future__ import annotations

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep.text import main as text_main
from llmfoundry.data.streaming_guard import import_streaming


def convert(folder, out, tokenizer_dir, *flags) -> list[int]:
    argv = ["--input_folder", str(folder), "--output_folder", str(out), "--concat_tokens", "8",
            "--tokenizer", str(tokenizer_dir), "--processes", "1", "--files_per_group", "2", "--quiet", *flags]
    assert text_main(argv) == 0
    dataset = import_streaming().StreamingDataset(local=str(out))
    return [int(t) for i in range(len(dataset)) for t in dataset[i]["tokens"]]


@pytest.fixture
def two_docs(tmp_path, corpus):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(2):
        (folder / f"doc{i}.txt").write_text(" ".join(corpus[i * 3 : i * 3 + 3]))
    return folder


def test_use_tokenizer_eos_ends_documents_with_the_eos_token(two_docs, tmp_path, tokenizer_dir, tokenizer, capsys):
    flagged = convert(two_docs, tmp_path / "flag", tokenizer_dir, "--use_tokenizer_eos")
    assert "notice" not in capsys.readouterr().err
    assert flagged.count(tokenizer.eos_token_id) >= 1
    assert convert(two_docs, tmp_path / "eos_text", tokenizer_dir, "--eos_text", tokenizer.eos_token) == flagged
    nothing = convert(two_docs, tmp_path / "none", tokenizer_dir, "--eos_text", "")  # llm-foundry's default
    assert tokenizer.eos_token_id not in nothing


def test_unset_eos_text_uses_the_eos_token_with_a_notice(two_docs, tmp_path, tokenizer_dir, capsys):
    default = convert(two_docs, tmp_path / "default", tokenizer_dir)
    notice = capsys.readouterr().err
    assert "--eos_text is not set: documents end with the tokenizer's EOS token" in notice
    assert "--use_tokenizer_eos" in notice
    assert default == convert(two_docs, tmp_path / "flag", tokenizer_dir, "--use_tokenizer_eos")


def test_use_tokenizer_eos_with_eos_text_is_an_error(two_docs, tmp_path, tokenizer_dir):
    with pytest.raises(ConfigError, match="--use_tokenizer_eos: set it or --eos_text, not both"):
        convert(two_docs, tmp_path / "both", tokenizer_dir, "--use_tokenizer_eos", "--eos_text", "</s>")
