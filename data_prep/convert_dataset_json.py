"""Convert JSON/JSONL records with a text field to tokenized, concatenated MDS (see llmfoundry.data.prep.json_data)."""

import sys

from llmfoundry.cli import run_main
from llmfoundry.data.prep.json_data import main_json

if __name__ == "__main__":
    sys.exit(run_main(main_json, sys.argv[1:]))
