"""`llmfoundry <command> ...`: dispatches to the `main(argv)` of the module that owns the command."""

from __future__ import annotations

import importlib
import sys

from llmfoundry.core.errors import ConfigError, did_you_mean

# command -> (module with `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("llmfoundry.commands.train", "train from a YAML recipe: llmfoundry train RECIPE.yaml [key=value ...]"),
    "eval": ("llmfoundry.commands.eval", "score models on ICL tasks and the gauntlet: llmfoundry eval RECIPE.yaml"),
    "convert": ("llmfoundry.commands.convert", "export a checkpoint to a Hugging Face folder"),
    "generate": ("llmfoundry.inference.generate", "generate text from a checkpoint or Hugging Face folder"),
    "chat": ("llmfoundry.inference.chat", "chat with a model in the terminal"),
    "check": ("llmfoundry.commands.check", "validate a recipe and list what differs from llm-foundry: llmfoundry check "
              "RECIPE.yaml"),
    "slurm": ("llmfoundry.commands.slurm", "submit a training job to Slurm: llmfoundry slurm RECIPE.yaml --nodes N "
              "--gpus-per-node G"),
    "k8s": ("llmfoundry.commands.k8s", "write Kubeflow TrainJob/PyTorchJob manifests: llmfoundry k8s RECIPE.yaml "
            "--nodes N --gpus-per-node G --image IMAGE"),
    "data": ("llmfoundry.data.prep.cli", "prepare datasets as MDS shards: llmfoundry data {text,json,hf,finetuning}"),
}


def _usage() -> str:
    lines = ["usage: llmfoundry <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def run_main(main, argv: list[str]) -> int:
    """Run a command's main; bad user input becomes a clear message and exit code 2, with no traceback."""
    try:
        return int(main(argv) or 0)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
