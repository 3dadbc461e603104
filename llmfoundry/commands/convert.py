"""`llmfoundry convert CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--hf_repo_for_upload REPO [--test_uploaded_model]]`:
export a model to a transformers-native folder (or, with ``--recipe RECIPE.yaml``, to a checkpoint of ours).

CHECKPOINT is one of our checkpoints (a checkpoint folder or a save_folder), a checkpoint written by llm-foundry
(Composer: a ``*.pt`` file or a sharded folder) or a Hugging Face folder, local or in an object store (``s3://``, ``gs://``, Azure, ``oci://``, or
the Hub, read-only: ``hf://ORG/NAME``); the exported folder loads with ``transformers.AutoModelForCausalLM.from_pretrained`` and no
``trust_remote_code`` (see llmfoundry.models.hf_export for which transformers class each architecture maps to).

OUT_DIR is a local folder or an object-store prefix (``s3://bucket/prefix``, gs://, Azure, oci://): a remote export is written to a local staging folder and
uploaded with ``config.json`` and a ``.complete`` marker last (llmfoundry.train.uploads.publish_folder), so a
reader never takes a partial upload for a model. ``--hf_repo_for_upload`` (llm-foundry's convert_composer_to_hf
flag) then uploads the folder to a Hugging Face Hub repo, created private if missing; ``--test_uploaded_model``
loads it back from there and compares it with the export. Whether the Hub can be reached is checked before the
model is loaded, so an offline machine fails at once.

This module (flags and the checks up front) stays free of torch and transformers; the export is
commands/convert_run.py, imported once the flags and destinations are good.
"""

from __future__ import annotations

import argparse

from llmfoundry.commands import train
from llmfoundry.commands.convert_checks import FILE_URL, check_outputs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmfoundry convert", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint folder of ours or a Hugging Face folder, local or in an object store")
    parser.add_argument("out_dir", help="where to write the transformers-native folder: a local folder or an object-store URL")
    # the short names only (llmfoundry.core.dtype_names also knows float32, bfloat16 and float16)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--hf_repo_for_upload", metavar="REPO", default=None,
                        help="also upload the folder to this Hugging Face Hub repo (created private if missing), "
                             f"or to a local folder given as a {FILE_URL} URL")
    parser.add_argument("--test_uploaded_model", action="store_true",
                        help="load the uploaded model back from --hf_repo_for_upload and compare it with the export")
    parser.add_argument("--recipe", metavar="RECIPE.yaml", default=None,
                        help="write a checkpoint of this project instead (a DCP folder in OUT_DIR, resumable with "
                             "load_path or autoresume): the training recipe the checkpoint continues with builds the "
                             "model and optimizer, which take the weights, optimizer state, time and data position "
                             "of CHECKPOINT (a Composer checkpoint, say)")
    args = parser.parse_args(argv)
    if args.recipe is not None:
        return write_training_checkpoint(args.checkpoint, args.out_dir, args.recipe)
    check_outputs(args.out_dir, args.hf_repo_for_upload, args.test_uploaded_model)  # before the slow part
    from llmfoundry.commands.convert_run import convert_model  # the heavy stage, once the flags are good

    convert_model(args.checkpoint, args.out_dir, args.dtype, args.hf_repo_for_upload, args.test_uploaded_model)
    return 0


def write_training_checkpoint(checkpoint: str, out_dir: str, recipe: str) -> int:
    """``llmfoundry train RECIPE load_path=CHECKPOINT save_folder=OUT_DIR only_composer_checkpoint=true``: the
    recipe's model and optimizer restored from CHECKPOINT, saved as one checkpoint of ours, without training."""
    overrides = [f"load_path={checkpoint}", f"save_folder={out_dir}", "only_composer_checkpoint=true",
                 "autoresume=false", "load_weights_only=false"]
    return train.main([recipe, *overrides])
