"""Convert a Hugging Face dataset to tokenized, concatenated MDS (see llmfoundry.data.prep.json_data)."""

import sys

from llmfoundry.cli import run_main
from llmfoundry.data.prep.json_data import main_hf

if __name__ == "__main__":
    sys.exit(run_main(main_hf, sys.argv[1:]))
