"""Convert a folder of text files to tokenized, concatenated MDS shards (see llmfoundry.data.prep.text)."""

import sys

from llmfoundry.cli import run_main
from llmfoundry.data.prep.text import main

if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
