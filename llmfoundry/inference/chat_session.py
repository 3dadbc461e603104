"""`llmfoundry chat` once its flags are checked (inference/chat.py documents it): the chat template, the streamed
answers, the conversation and its commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import StoppingCriteriaList
from transformers.generation import BaseStreamer

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning import CHATML_TEMPLATE
from llmfoundry.inference.flags import CHAT_HELP, USER_PROMPT
from llmfoundry.inference.sampling import device_named, position_limit, sampling_options
from llmfoundry.loading import load_model
from llmfoundry.models.interface import context_length

CHATML_END = "<|im_end|>"
ASSISTANT_PREFIX = "Assistant: "


class ChatTemplate:
    """Renders a message list into the prompt text for the next assistant turn."""

    def __init__(self, tokenizer, template: str | None = None):
        self.tokenizer = tokenizer
        self.template = template or getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
        self.is_chatml = self.template == CHATML_TEMPLATE
        # strings that end an answer besides the EOS token
        self.stop_strings = [CHATML_END] if CHATML_END in self.template else []

    def render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, add_generation_prompt=True, tokenize=False
        )


class TerminalStreamer(BaseStreamer):
    """A transformers streamer that prints an answer as its tokens arrive and notices stop strings.

    Text is decoded from all answer tokens so far (so multi-byte characters come out whole); a tail that could
    be the start of a stop string is held back until it is known not to be one.
    """

    def __init__(self, tokenizer, stop_strings: list[str], out=None):
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.out = out or sys.stdout
        self.reset()

    def reset(self) -> None:
        self.ids: list[int] = []
        self.printed = 0
        self.text = ""
        self.stopped = False
        self._skip_prompt = True

    def put(self, value: torch.Tensor) -> None:
        if self._skip_prompt:  # generate() first hands over the prompt
            self._skip_prompt = False
            return
        if self.stopped:
            return
        self.ids.extend(value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for stop in self.stop_strings:
            at = text.find(stop)
            if at >= 0:
                text, self.stopped = text[:at], True
        self.text = text
        if self.stopped:
            self._emit(len(text))
            return
        safe = len(text)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character
            safe -= 1
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, safe), 0, -1):
                if text[:safe].endswith(stop[:n]):
                    safe -= n
                    break
        self._emit(safe)

    def _emit(self, upto: int) -> None:
        if upto > self.printed:
            self.out.write(self.text[self.printed : upto])
            self.out.flush()
            self.printed = upto

    def end(self) -> None:
        self._emit(len(self.text))


class StopWhenStreamerStops:
    """A stopping criterion: stop generating once the streamer has seen a stop string."""

    def __init__(self, streamer: TerminalStreamer):
        self.streamer = streamer

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.streamer.stopped, dtype=torch.bool, device=input_ids.device)


class ChatSession:
    """The conversation state and one answer per user message."""

    def __init__(self, model, tokenizer, args: argparse.Namespace, out=None):
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self.out = out or sys.stdout
        self.template = ChatTemplate(tokenizer, _read_template(args.chat_template))
        self.system = args.system
        self.history: list[dict[str, str]] = []
        self.streamer = TerminalStreamer(tokenizer, self.template.stop_strings, self.out)
        self.limit = context_length(model)
        self.positions = position_limit(model)  # learned positions: answers must stop at the last one
        self.device = next(model.parameters()).device

    def messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.history

    def prompt_ids(self) -> list[int]:
        """The templated conversation as token ids, dropping the oldest exchanges until it fits the context."""
        while True:
            text = self.template.render(self.messages())
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if self.limit is None or len(ids) + self.args.max_new_tokens <= self.limit or len(self.history) <= 1:
                if self.limit is not None and len(ids) + self.args.max_new_tokens > self.limit:
                    ids = ids[-max(1, self.limit - self.args.max_new_tokens) :]  # one long message: keep its end
                return ids
            self.history = self.history[2:] if len(self.history) > 2 else self.history[-1:]

    def answer(self, user_text: str) -> str:
        self.history.append({"role": "user", "content": user_text})
        ids = self.prompt_ids()
        if self.args.show_prompt:
            self.out.write(f"[prompt]\n{self.tokenizer.decode(ids)}\n[/prompt]\n")
        self.out.write(ASSISTANT_PREFIX)
        self.out.flush()
        self.streamer.reset()
        input_ids = torch.tensor([ids], device=self.device)
        room = self.args.max_new_tokens
        if self.positions is not None:  # a model with learned positions cannot run past them: answer shorter
            room = max(1, min(room, self.positions - len(ids)))
        options = dict(
            max_new_tokens=room,
            attention_mask=torch.ones_like(input_ids),
            streamer=self.streamer,
            stopping_criteria=StoppingCriteriaList([StopWhenStreamerStops(self.streamer)]),
            eos_token_id=self._eos_ids(),
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id,
            use_cache=True,
            **sampling_options(self.args.temperature, self.args.top_p, self.args.top_k, self.args.repetition_penalty),
        )  # fmt: skip
        with torch.no_grad():
            self.model.generate(input_ids, **options)
        self.streamer.end()
        self.out.write("\n")
        self.out.flush()
        reply = self.streamer.text.strip()
        self.history.append({"role": "assistant", "content": reply})
        return reply

    def _eos_ids(self) -> list[int] | None:
        ids = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        end = self.tokenizer.convert_tokens_to_ids(CHATML_END) if CHATML_END in self.tokenizer.get_vocab() else None
        if end is not None:
            ids.append(end)
        return ids or None

    def handle(self, line: str) -> bool:
        """Act on one input line; False means leave."""
        text = line.strip()
        command, _, rest = text.partition(" ")
        if text in ("quit", "exit"):
            return False
        if not text:
            return True
        if text == "clear":
            self.history = []
            self.out.write("(conversation cleared)\n")
        elif command == "system":
            self.system = rest.strip() or None
            self.history = []
            self.out.write(f"(system message {'set' if self.system else 'removed'}; conversation cleared)\n")
        elif text in ("help", "?"):
            self.out.write(CHAT_HELP + "\n")
        else:
            self.answer(text)
        self.out.flush()
        return True


def _read_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if "{%" in value or "{{" in value:
        return value
    raise ConfigError(f"--chat_template: '{value}' is neither a file nor a Jinja template")


def run_chat(args: argparse.Namespace) -> int:
    """The terminal conversation with the model at ``args.model`` until quit or end of input."""
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, device=device_named(args.device))
    session = ChatSession(model, tokenizer, args)
    note = "" if not session.template.is_chatml or getattr(tokenizer, "chat_template", None) else " (ChatML template)"
    print(f"chatting with {args.model}{note}; {CHAT_HELP}", flush=True)
    while True:
        try:
            line = input(USER_PROMPT)
        except EOFError:
            print()
            break
        if not session.handle(line):
            break
    return 0
