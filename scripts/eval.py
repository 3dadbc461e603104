"""Evaluate models on ICL tasks and the gauntlet: python scripts/eval.py RECIPE.yaml [key=value ...]."""

import sys

from llmfoundry.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
