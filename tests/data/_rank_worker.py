"""Run by test_multirank.py as one simulated rank: iterate some batches of the text loader, dump rows and state."""

import json
import sys

from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.text import build_text_dataloader
from llmfoundry.data.tokenizers import build_tokenizer

local, tokenizer_dir, out, steps, state_in = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
settings = TextLoaderSettings(dataset=TextDatasetSettings(local=local, max_seq_len=32, shuffle=True, shuffle_seed=5,
                                                          num_canonical_nodes=2), drop_last=False, num_workers=1)
loader = build_text_dataloader(settings, build_tokenizer(tokenizer_dir, {}), 2)
if state_in != "-":
    loader.load_state_dict(json.load(open(state_in)))
rows = []
batches = iter(loader)
while steps != 0:
    batch = next(batches, None)
    if batch is None:
        break
    rows += batch["input_ids"].tolist()
    steps -= 1
json.dump({"rows": rows, "state": loader.state_dict()}, open(out, "w"))
