"""`llmfoundry chat MODEL`: talk to a model in the terminal, one streamed answer at a time.

MODEL is one of our checkpoints (a save_folder or one checkpoint folder) or a Hugging Face folder, loaded the
same way as `llmfoundry generate`. The conversation is formatted with the tokenizer's chat template (ChatML when
the tokenizer has none, as in finetuning) and the whole history goes into every prompt; the oldest turns are
dropped when it no longer fits the model's context. Commands typed at the prompt:

    clear           forget the conversation (the system message stays)
    system TEXT     set the system message and start a new conversation
    quit            leave (also: exit, or end of input with Ctrl-D)

The flags are checked without torch; the conversation itself is inference/chat_session.py.
"""

from __future__ import annotations

import argparse

from llmfoundry.inference.flags import CHAT_HELP, add_sampling_arguments, check_sampling_arguments


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmfoundry chat", description=__doc__.split("\n\n")[0],
                                     epilog=CHAT_HELP)  # fmt: skip
    parser.add_argument("model", help="a checkpoint folder (or save_folder) of ours or a Hugging Face folder")
    parser.add_argument("--system", default=None, help="system message at the start of the conversation")
    parser.add_argument("--chat_template", default=None, help="a Jinja chat template (file or text) to use instead")
    parser.add_argument("--show_prompt", action="store_true", help="print the templated prompt before each answer")
    add_sampling_arguments(parser, max_new_tokens=256, temperature=0.7, top_p=0.95)
    args = parser.parse_args(argv)
    check_sampling_arguments(args)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)

    from llmfoundry.inference.chat_session import run_chat  # the model stack, once the flags are good

    return run_chat(args)
