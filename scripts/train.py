"""Train from a YAML recipe: `python scripts/train.py RECIPE.yaml [key=value ...]` (also under torchrun)."""

import sys

from llmfoundry.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
