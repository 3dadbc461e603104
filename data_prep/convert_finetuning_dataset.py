"""Convert prompt/response or chat data to MDS of tokenized examples (see llmfoundry.data.prep.finetuning)."""

import sys

from llmfoundry.cli import run_main
from llmfoundry.data.prep.finetuning import main

if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
