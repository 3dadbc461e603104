"""build_tokenizer on SentencePiece .model files: the ids are sentencepiece's own, for BPE and unigram models."""

from __future__ import annotations

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.tokenizers import build_tokenizer

ODD_TEXTS = ["  leading and   inner   spaces  ", "tab\tand\nnewline\n\nend", "Quick ＦＵＬＬ-width ① and ünïcödé",
             "no_space.after,punctuation!", "x", ""]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def spm_model(request, tmp_path_factory, corpus):
    import sentencepiece as spm

    prefix = tmp_path_factory.mktemp(f"spm_{request.param}") / request.param
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus[:150]), model_prefix=str(prefix), vocab_size=120,
                                   model_type=request.param, character_coverage=1.0, minloglevel=2)
    return str(prefix) + ".model", spm.SentencePieceProcessor(model_file=str(prefix) + ".model")


def test_sentencepiece_model_tokenizes_exactly_like_sentencepiece(spm_model, corpus):
    model_file, sp = spm_model
    tokenizer = build_tokenizer(model_file)
    texts = corpus[150:190] + ODD_TEXTS
    for text in texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == sp.encode(text), text
        assert tokenizer(text)["input_ids"] == sp.encode(text)  # no BOS/EOS added by default
    # the converters tokenize whole batches (the batched path must agree too)
    assert tokenizer(texts, add_special_tokens=False)["input_ids"] == sp.encode(texts)
    # the same through `name: sentencepiece` with kwargs.model_file
    by_kwargs = build_tokenizer("sentencepiece", {"model_file": model_file})
    assert by_kwargs(texts[0])["input_ids"] == sp.encode(texts[0])


def test_sentencepiece_decode_round_trips_and_eos_is_the_models(spm_model, corpus):
    model_file, sp = spm_model
    tokenizer = build_tokenizer(model_file)
    for text in corpus[150:170]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    for text in ODD_TEXTS:
        assert tokenizer.decode(sp.encode(text)) == sp.decode(sp.encode(text))
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == sp.eos_id() >= 0
    assert tokenizer.bos_token_id == sp.bos_id() and tokenizer.unk_token_id == sp.unk_id()
    # EOS written as text (what the converters' default --eos_text is) is the EOS id, between sentencepiece ids
    assert tokenizer("the cat</s>the dog")["input_ids"] == sp.encode("the cat") + [sp.eos_id()] + sp.encode("the dog")
    assert tokenizer([tokenizer.eos_token], add_special_tokens=False)["input_ids"] == [[sp.eos_id()]]
    assert tokenizer.decode(sp.encode("the cat") + [sp.eos_id()]) == "the cat</s>"
    assert tokenizer.decode(sp.encode("the cat") + [sp.eos_id()], skip_special_tokens=True) == "the cat"
    with_bos = build_tokenizer(model_file, {"add_bos_token": True})
    assert with_bos("the cat")["input_ids"] == [sp.bos_id()] + sp.encode("the cat")


def test_saved_sentencepiece_tokenizer_reloads_with_the_same_ids(spm_model, corpus, tmp_path):
    from transformers import AutoTokenizer

    model_file, sp = spm_model
    build_tokenizer(model_file).save_pretrained(str(tmp_path / "tok"))
    texts = corpus[150:160] + ODD_TEXTS
    for reloaded in (build_tokenizer(str(tmp_path / "tok")), AutoTokenizer.from_pretrained(str(tmp_path / "tok"))):
        assert reloaded.eos_token_id == sp.eos_id()
        assert [reloaded(t, add_special_tokens=False)["input_ids"] for t in texts] == sp.encode(texts)


@pytest.mark.parametrize("name", ["./data/missing/tokenizer", "/no/such/folder", "a/b/c"])
def test_a_missing_tokenizer_folder_is_named_as_a_folder_not_a_hub_id(name):
    with pytest.raises(ConfigError, match=f"tokenizer.name: folder '{name}' does not exist"):
        build_tokenizer(name, {})
