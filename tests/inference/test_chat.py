"""`llmfoundry chat` driven over a pseudo-terminal, as a person at a keyboard would use it."""

from __future__ import annotations

import io
import os
import pty
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llmfoundry.cli import main
from llmfoundry.inference.chat import parse_args
from llmfoundry.inference.chat_session import ChatSession, TerminalStreamer
from llmfoundry.loading import load_model
from llmfoundry.models.hf_export import export_hf
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory, tokenizer):
    """A tiny MPT (random weights) exported to a Hugging Face folder with the test tokenizer (no chat template)."""
    torch.manual_seed(0)
    config = MPTConfig(d_model=32, n_heads=2, n_layers=2, expansion_ratio=4, max_seq_len=512, vocab_size=512,
                       learned_pos_emb=False, no_bias=True, attn_config={"alibi": True})  # fmt: skip
    out = tmp_path_factory.mktemp("chat_model")
    export_hf(MPTForCausalLM(config).eval(), tokenizer, out, "fp32")
    return out


class Terminal:
    """A child process on a pseudo-terminal, with expect-style reading."""

    def __init__(self, argv: list[str]):
        self.master, slave = pty.openpty()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TERM": "dumb"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env,
                                     close_fds=True)  # fmt: skip
        os.close(slave)
        # selectors (epoll/poll), not select.select: by the time this runs the test process may hold more than
        # 1024 descriptors (streaming keeps each dataset's shared memory open until exit), which select rejects.
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.master, selectors.EVENT_READ)
        self.buffer = ""

    def expect(self, text: str, timeout: float = 60.0) -> str:
        """Everything up to and including the next ``text``; the rest stays buffered."""
        deadline = time.monotonic() + timeout
        while text not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {text!r}; output so far:\n{self.buffer}")
            if self.selector.select(left):
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"process ended while waiting for {text!r}; output:\n{self.buffer}")
                self.buffer += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
        at = self.buffer.index(text) + len(text)
        seen, self.buffer = self.buffer[:at], self.buffer[at:]
        return seen

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.selector.close()
            os.close(self.master)


def _turn(term: Terminal, message: str) -> tuple[str, str]:
    """Send one message; returns (the prompt the model saw, its answer)."""
    term.send(message)
    term.expect("[prompt]\n")
    prompt = term.expect("\n[/prompt]\n")[: -len("\n[/prompt]\n")]
    term.expect("Assistant: ")
    answer = term.expect("\nUser: ")[: -len("\nUser: ")]
    return prompt, answer


def test_chat_over_a_terminal_answers_keeps_history_and_quits(chat_model_dir):
    term = Terminal([sys.executable, "-m", "llmfoundry.cli", "chat", str(chat_model_dir), "--temperature", "0",
                     "--max_new_tokens", "6", "--show_prompt"])  # fmt: skip
    try:
        term.expect("User: ")
        prompt1, answer1 = _turn(term, "my cat is blue")
        assert answer1.strip(), "the model gave no answer"
        assert "<|im_start|>user\nmy cat is blue<|im_end|>" in prompt1  # ChatML: the tokenizer has no template
        prompt2, answer2 = _turn(term, "what colour is my cat")
        first_exchange = f"my cat is blue<|im_end|>\n<|im_start|>assistant\n{answer1.strip()}<|im_end|>"
        assert first_exchange in prompt2, "the second prompt does not carry the first exchange"
        assert prompt2.endswith("<|im_start|>user\nwhat colour is my cat<|im_end|>\n<|im_start|>assistant\n")

        term.send("system You answer in one word.")
        term.expect("conversation cleared)\nUser: ")
        prompt3, _ = _turn(term, "hello")
        assert prompt3.startswith("<|im_start|>system\nYou answer in one word.<|im_end|>")
        assert "my cat" not in prompt3

        term.send("clear")
        term.expect("(conversation cleared)\nUser: ")
        prompt4, _ = _turn(term, "again")
        assert "hello" not in prompt4 and "You answer in one word." in prompt4

        term.send("quit")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.proc.kill()


def test_streamer_stops_at_the_chatml_end_and_never_prints_part_of_it(tokenizer):
    out = io.StringIO()
    streamer = TerminalStreamer(tokenizer, ["<|im_end|>"], out)
    streamer.put(torch.tensor([[1, 2, 3]]))  # the prompt: skipped
    printed = []
    for token in tokenizer("Blue cat.<|im_end|> more text", add_special_tokens=False)["input_ids"]:
        streamer.put(torch.tensor([token]))
        printed.append(out.getvalue())
    streamer.end()
    assert out.getvalue() == "Blue cat." and streamer.text == "Blue cat." and streamer.stopped
    assert all("<" not in p for p in printed), "a prefix of the stop string was printed"
    assert printed == sorted(printed, key=len)  # text only ever grows


def test_chat_rejects_bad_sampling_options():
    assert main(["chat", "somewhere", "--temperature", "-1"]) == 2
    assert main(["chat", "somewhere", "--top_p", "0"]) == 2


def test_chat_history_drops_oldest_turns_to_fit_the_context(chat_model_dir):
    model, tokenizer = load_model(chat_model_dir)
    args = parse_args([str(chat_model_dir), "--temperature", "0", "--max_new_tokens", "4"])
    session = ChatSession(model, tokenizer, args, out=io.StringIO())
    session.limit = 160
    lengths = []
    prompt_ids = session.prompt_ids
    session.prompt_ids = lambda: lengths.append(len(ids := prompt_ids())) or ids
    for i in range(6):
        session.answer(f"message number {i} about a green river")
    assert all(n + args.max_new_tokens <= 160 for n in lengths)
    assert session.history[-2]["content"] == "message number 5 about a green river"
    assert not any(m["content"].startswith("message number 0") for m in session.history)
    assert len(session.history) < 12


def test_answers_stop_at_the_learned_positions_of_the_model(tmp_path, tokenizer):
    """A model with learned absolute positions cannot run past them: chat shortens the answer instead of failing,
    and generate says how many new tokens fit."""
    torch.manual_seed(0)
    model = MPTForCausalLM(MPTConfig(d_model=32, n_heads=2, n_layers=1, max_seq_len=48, vocab_size=512)).eval()
    assert model.arch.learned_pos_emb
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    args = parse_args([str(tmp_path), "--temperature", "0", "--max_new_tokens", "200"])
    session = ChatSession(model, tokenizer, args, out=io.StringIO())
    for _ in range(3):
        session.answer("a long enough message about a green river")  # must not raise past position 48

    assert main(["generate", str(tmp_path), "--prompt", "a short prompt", "--max_new_tokens", "200"]) == 2
