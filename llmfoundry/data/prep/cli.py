"""``llmfoundry data {text,json,hf,finetuning} [flags]``: the converters, as one command.

    llmfoundry data text --input_folder docs/ --output_folder s3://bucket/docs --concat_tokens 2048 --tokenizer gpt2
    llmfoundry data json --path data.jsonl --out_root mds/ --concat_tokens 2048 --tokenizer gpt2
    llmfoundry data hf --dataset allenai/c4 --data_subset en --out_root mds/ --concat_tokens 2048 --tokenizer gpt2
    llmfoundry data finetuning --dataset chat.jsonl --out_root ft/ --tokenizer gpt2 --max_seq_len 2048

Each takes ``--ray [--ray-address ADDR] [--ray-workers N]`` to tokenize and write on a Ray cluster with Ray Data
(the same samples, in the same order; see llmfoundry.data.prep.ray_data).
"""

from __future__ import annotations

import sys

from llmfoundry.core.errors import ConfigError, did_you_mean
from llmfoundry.registry import resolve

# subcommand -> ("module:function" run with the remaining arguments, one-line help); a converter's module (and
# with it the tokenizer and MDS stack) is imported only when it runs, as cli.py does with the commands
SUBCOMMANDS = {
    "text": ("llmfoundry.data.prep.text:main", "a folder of .txt files -> concatenated MDS"),
    "json": ("llmfoundry.data.prep.json_data:main_json", "JSON/JSONL records with a text field -> concatenated MDS"),
    "hf": ("llmfoundry.data.prep.json_data:main_hf", "a Hugging Face dataset -> concatenated MDS"),
    "finetuning": ("llmfoundry.data.prep.finetuning:main", "prompt/response or chat data -> MDS"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: llmfoundry data {text,json,hf,finetuning} [flags]\n")
        for name, (_, help_) in SUBCOMMANDS.items():
            print(f"  {name:<11} {help_}")
        return 0 if argv else 2
    if argv[0] not in SUBCOMMANDS:
        raise ConfigError(f"unknown data command '{argv[0]}'{did_you_mean(argv[0], SUBCOMMANDS)}; "
                          f"valid: {', '.join(SUBCOMMANDS)}")
    return resolve(SUBCOMMANDS[argv[0]][0])(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
