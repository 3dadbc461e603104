"""The command lines of `llmfoundry generate` and `llmfoundry chat`: their decoding flags and checks, and the chat
prompt's texts. Light (no torch or transformers): ``--help`` and a bad flag are answered before a model stack loads."""

from __future__ import annotations

import argparse

from llmfoundry.core.errors import ConfigError

USER_PROMPT = "User: "
CHAT_HELP = "commands: clear (new conversation), system TEXT (set the system message), quit"


def add_sampling_arguments(parser: argparse.ArgumentParser, *, max_new_tokens: int, temperature: float,
                           top_p: float) -> None:  # fmt: skip
    """The decoding flags, with the command's own defaults for the three that differ between commands."""
    parser.add_argument("--max_new_tokens", type=int, default=max_new_tokens, help="longest completion in tokens")
    parser.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    parser.add_argument("--top_p", type=float, default=top_p, help="nucleus sampling: keep this much probability")
    parser.add_argument("--top_k", type=int, default=0, help="0 = no top-k filtering")
    parser.add_argument("--repetition_penalty", type=float, default=1.0, help="1 = none")
    parser.add_argument("--seed", type=int, default=42, help="sampling seed")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda when available, else cpu)")


def check_sampling_arguments(args: argparse.Namespace) -> None:
    if args.max_new_tokens <= 0:
        raise ConfigError(f"--max_new_tokens: must be positive, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ConfigError(f"--temperature: must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ConfigError(f"--top_p: must be in (0, 1], got {args.top_p}")
    if args.top_k < 0:
        raise ConfigError(f"--top_k: must be >= 0, got {args.top_k}")
    if args.repetition_penalty <= 0:
        raise ConfigError(f"--repetition_penalty: must be positive, got {args.repetition_penalty}")
