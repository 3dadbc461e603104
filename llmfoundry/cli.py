"""`llmfoundry <command> ...`: dispatches to the `main(argv)` of the module that owns the command."""

from __future__ import annotations

import importlib
import sys
import unicodedata

from llmfoundry.core.errors import CollectiveError, ConfigError, did_you_mean
from llmfoundry.core.secrets import protect_process

# command -> (module with `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("llmfoundry.commands.train", "train from a YAML recipe: llmfoundry train RECIPE.yaml [key=value ...]"),
    "eval": ("llmfoundry.commands.eval", "score models on ICL tasks and the gauntlet: llmfoundry eval RECIPE.yaml"),
    "convert": ("llmfoundry.commands.convert", "export a checkpoint to a Hugging Face folder"),
    "generate": ("llmfoundry.inference.generate", "generate text from a checkpoint or Hugging Face folder"),
    "chat": ("llmfoundry.inference.chat", "chat with a model in the terminal"),
    "check": ("llmfoundry.commands.check", "validate a recipe and list what differs from llm-foundry: llmfoundry check "
              "RECIPE.yaml"),
    "plan": ("llmfoundry.commands.plan", "estimate memory, step time, MFU and cost of a recipe on N GPUs, with "
             "changes that fit or run faster: llmfoundry plan RECIPE.yaml --nodes N --gpus-per-node G [--gpu h100]"),
    "slurm": ("llmfoundry.commands.slurm", "submit a training job to Slurm: llmfoundry slurm RECIPE.yaml --nodes N "
              "--gpus-per-node G"),
    "k8s": ("llmfoundry.commands.k8s", "write Kubeflow TrainJob/PyTorchJob manifests: llmfoundry k8s RECIPE.yaml "
            "--nodes N --gpus-per-node G --image IMAGE"),
    "ray": ("llmfoundry.commands.ray", "train on a Ray cluster: llmfoundry ray RECIPE.yaml --num-workers N"),
    "data": ("llmfoundry.data.prep.cli", "prepare datasets as MDS shards: llmfoundry data {text,json,hf,finetuning}"),
}


def _usage() -> str:
    lines = ["usage: llmfoundry <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def printable(text: str) -> str:
    """``text`` with control characters and line or paragraph separators escaped (``\\n``, ``\\x0c``, ``\\u2028``):
    an error quoting a value or a file's contents stays on one line and cannot drive the terminal."""
    return "".join(repr(c)[1:-1] if c != "\t" and unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") else c
                   for c in text)


def run_main(main, argv: list[str]) -> int:
    """Run a command's main; bad user input becomes a clear message and exit code 2, with no traceback."""
    try:
        return int(main(argv) or 0)
    except ConfigError as error:
        # one line per problem, whatever the problems quote (a value, a file's line) holds
        print(f"error: {ConfigError.many([printable(problem) for problem in error.problems])}", file=sys.stderr)
        return 2
    except CollectiveError as error:  # a rank stopped or hangs: which rank waited for what, in one line
        print(f"error: {printable(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    protect_process(argv)  # before any logger records the command line or the console
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command '{command}'{did_you_mean(command, COMMANDS)}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return run_main(module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
