"""``tokenizer.name: tiktoken`` with llm-foundry's TiktokenTokenizerWrapper keys: add_bos_token, add_eos_token,
use_default_system_prompt, its default special tokens and chat template. A tiny tiktoken encoding is built here
(nothing is downloaded); the expected ids are those llm-foundry 0.22.0's wrapper gives for the same encoding."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.tiktoken_tokenizer import DEFAULT_SYSTEM_PROMPT
from llmfoundry.data.tokenizers import build_tokenizer

tiktoken = pytest.importorskip("tiktoken")
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT, IM_START, IM_END = 258, 259, 260
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"}]


def tiny_encoding(specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    ranks = {bytes([i]): i for i in range(256)} | {b"ab": 256, b" c": 257}
    return tiktoken.Encoding("tiny", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={text: 258 + i for i, text in enumerate(specials)})


def tiny(**kwargs):
    return build_tokenizer("tiktoken", {"encoding": tiny_encoding(), **kwargs})


@pytest.mark.parametrize("add_bos, add_eos, single, pair", [
    (False, False, [256, 257, IM_END, 32, 120], [256, 99]),
    (True, False, [EOT, 256, 257, IM_END, 32, 120], [EOT, 256, EOT, 99]),
    (False, True, [256, 257, IM_END, 32, 120, EOT], [256, EOT, 99, EOT]),
    (True, True, [EOT, 256, 257, IM_END, 32, 120, EOT], [EOT, 256, EOT, EOT, 99, EOT]),
])  # fmt: skip
def test_add_bos_and_add_eos_tokens_wrap_each_text_as_llm_foundry(add_bos, add_eos, single, pair):
    tokenizer = tiny(add_bos_token=add_bos, add_eos_token=add_eos)
    assert tokenizer.bos_token == tokenizer.eos_token == tokenizer.unk_token == "<|endoftext|>"
    assert tokenizer.pad_token is None
    assert tokenizer("ab c<|im_end|> x")["input_ids"] == single
    assert tokenizer("ab", "c")["input_ids"] == pair
    assert tokenizer("ab c", add_special_tokens=False)["input_ids"] == [256, 257]


def test_chat_template_is_llm_foundrys_chatml_with_an_optional_default_system_prompt():
    plain, with_default = tiny(), tiny(use_default_system_prompt=True)
    assert plain.apply_chat_template(CHAT, tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nab<|im_end|>")
    assert plain.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert with_default.apply_chat_template(CHAT, tokenize=False) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nab<|im_end|>")
    own_system = [{"role": "system", "content": "  Be brief.\n"}, *CHAT]
    for tokenizer in (plain, with_default):  # a conversation's own system message wins (stripped)
        assert tokenizer.apply_chat_template(own_system, tokenize=False).startswith(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi")
    assert plain.apply_chat_template(CHAT, tokenize=True, return_dict=False) == [
        IM_START, 117, 115, 101, 114, 10, 104, 105, IM_END, 10, IM_START, 97, 115, 115, 105, 115, 116, 97, 110, 116,
        10, 256, IM_END]  # fmt: skip
    custom = tiny(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert custom.apply_chat_template(CHAT, tokenize=False) == "hiab"


def test_saved_tiktoken_tokenizer_reloads_with_its_special_tokens_and_template(tmp_path):
    tokenizer = tiny(add_bos_token=True, add_eos_token=True, use_default_system_prompt=True)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("ab c")["input_ids"] == tokenizer("ab c")["input_ids"] == [EOT, 256, 257, EOT]
    assert reloaded.apply_chat_template(CHAT, tokenize=False) == tokenizer.apply_chat_template(CHAT, tokenize=False)


def test_special_token_settings_that_cannot_work_are_one_line_errors():
    no_endoftext = tiny_encoding(specials=("<|im_start|>", "<|im_end|>"))
    with pytest.raises(ConfigError, match=r"tokenizer\.kwargs\.add_bos_token: the tokenizer has no bos_token"):
        build_tokenizer("tiktoken", {"encoding": no_endoftext, "add_bos_token": True, "eos_token": "<|im_end|>"})
    with pytest.raises(ConfigError, match=r"tokenizer\.kwargs\.eos_token: '</s>' is not a token of the tiktoken"):
        tiny(eos_token="</s>")
    with pytest.raises(ConfigError, match=r"tokenizer\.kwargs\.errors: only 'replace'"):
        tiny(errors="strict")
    assert tiny(eos_token="<|im_end|>").eos_token_id == IM_END
