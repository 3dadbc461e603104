"""`llmfoundry convert CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16]`: export a model to a transformers-native folder.

CHECKPOINT is one of our checkpoints (a checkpoint folder or a save_folder) or a Hugging Face folder, local or
``s3://``; the exported folder loads with ``transformers.AutoModelForCausalLM.from_pretrained`` and no
``trust_remote_code`` (see llmfoundry.models.hf_export for which transformers class each architecture maps to).
"""

from __future__ import annotations

import argparse

from llmfoundry.loading import load_model
from llmfoundry.models.hf_export import export_hf


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry convert", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint folder of ours or a Hugging Face folder")
    parser.add_argument("out_dir", help="where to write the transformers-native folder")
    # the short names only (llmfoundry.core.precision.DTYPES also knows float32, bfloat16 and float16)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.checkpoint)
    name = export_hf(model, tokenizer, args.out_dir, args.dtype)
    print(f"wrote {name} ({args.dtype}) to {args.out_dir}; load it with "
          f"transformers.AutoModelForCausalLM.from_pretrained('{args.out_dir}')")  # fmt: skip
    return 0
