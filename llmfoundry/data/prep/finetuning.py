"""Prompt/response or chat examples -> MDS of tokenized ``input_ids``/``labels`` (``convert_finetuning_dataset``).

Tokenization, targets and truncation are exactly the ``finetuning`` loader's (llmfoundry.data.finetuning); the
output is read back with ``train_loader: {name: finetuning, dataset: {remote: ..., split: ...}}``.
"""

from __future__ import annotations

import argparse
import logging
import os

import numpy as np

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning import FinetuningDataset, load_raw_examples
from llmfoundry.data.loader_settings import FinetuningDatasetSettings
from llmfoundry.data.prep import common, ray_data
from llmfoundry.data.tokenizers import build_tokenizer

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert_finetuning_dataset", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a .jsonl file, hub id, dataset folder, 'json', or s3://folder")
    parser.add_argument("--data_subset", default=None, help="dataset config name")
    parser.add_argument("--splits", nargs="+", default=["train"], help="splits to convert")
    parser.add_argument("--data_files", nargs="*", default=None, help="data files (with --dataset json)")
    parser.add_argument("--preprocessor", default=None,
                        help="a registered preprocessor name or module:function mapping a raw record to prompt/response "
                             "or messages (default: the one registered for --dataset, if any)")
    parser.add_argument("--out_root", required=True,
                        help="MDS output folder: local, or s3://, gs://, azure:// or oci://bucket/prefix")
    parser.add_argument("--compression", default="zstd", help="shard compression ('none' for none)")
    parser.add_argument("--tokenizer", required=True, help="HF tokenizer id/folder, .model file, or tiktoken")
    parser.add_argument("--tokenizer_kwargs", default=None, help="JSON object of tokenizer kwargs")
    parser.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true",
                        help="let a Hugging Face tokenizer run its own code (passed to AutoTokenizer)")
    parser.add_argument("--max_seq_len", type=int, required=True, help="tokens per example; longer ones are truncated")
    parser.add_argument("--target_prompts", default="none", help="none, all, or length>=N")
    parser.add_argument("--target_responses", default="last", choices=["last", "all"])
    parser.add_argument("--decoder_only_format", default=True, action=argparse.BooleanOptionalAction)
    parser.add_argument("--encoder_decoder", action="store_true",
                        help="llm-foundry's name for --no-decoder_only_format (context -> input_ids, response -> labels)")
    parser.add_argument("--skip-preprocessing", "--skip_preprocessing", dest="skip_preprocessing", action="store_true",
                        help="records are already prompt/response or messages: no preprocessor, not even the one "
                             "registered for --dataset")
    parser.add_argument("--local", default=None,
                        help="also keep the shards in this local folder when --out_root is in an object store")
    parser.add_argument("--num_workers", "--processes", dest="num_workers", type=int, default=None,
                        help="processes that tokenize examples (default: all cores); the output is the same for any")
    ray_data.add_arguments(parser)
    common.add_logging_argument(parser)
    args = parser.parse_args(argv)
    common.set_logging_level(args.logging_level)
    ray_data.check_flags(args, {"--num_workers": args.num_workers, "--local": args.local})
    if args.encoder_decoder:
        args.decoder_only_format = False
    if not args.decoder_only_format and (args.target_prompts != "none" or args.target_responses != "last"):
        flag = "--encoder_decoder" if args.encoder_decoder else "--no-decoder_only_format"
        raise ConfigError(f"{flag}: the labels are the last response; leave --target_prompts none and "
                          "--target_responses last")
    if args.skip_preprocessing and args.preprocessor:
        raise ConfigError("--skip-preprocessing: set it or --preprocessor, not both")
    if args.local is not None and not objectstore.is_remote(args.out_root):
        raise ConfigError(f"--local: keeps a local copy of a remote --out_root (s3://, gs://, azure://, oci://...); "
                          f"'{args.out_root}' is local")
    if args.num_workers is not None and args.num_workers < 1:
        raise ConfigError(f"--num_workers: expected >= 1, got {args.num_workers}")
    common.check_output(args.out_root, "--out_root")
    workers = args.num_workers or common.default_processes()
    tokenizer = build_tokenizer(args.tokenizer, common.tokenizer_kwargs_from_args(args), cli=True)
    common.require_eos(tokenizer)
    compression = None if str(args.compression).lower() in ("none", "") else args.compression
    dtype = common.tokens_dtype(common.vocab_size_of(tokenizer) + 1)  # labels hold -100: stored signed below
    signed = "int32" if dtype.itemsize <= 4 else "int64"
    with ray_data.session(args) as ray_workers:
        for split in args.splits:
            _convert_split(args, split, tokenizer, workers, ray_workers, compression, signed)
    return 0


def _convert_split(args, split: str, tokenizer, workers: int, ray_workers: int | None, compression, signed: str) -> None:
    hf_kwargs = {}
    name = args.dataset
    if args.data_files:
        name, hf_kwargs = "json", {"data_files": args.data_files}
    if args.data_subset:
        hf_kwargs["name"] = args.data_subset
    settings = FinetuningDatasetSettings(
        hf_name=name, hf_kwargs=hf_kwargs, split=split, preprocessing_fn=args.preprocessor,
        max_seq_len=args.max_seq_len, target_prompts=args.target_prompts, target_responses=args.target_responses,
        decoder_only_format=args.decoder_only_format,
    )
    out = objectstore.join(args.out_root, split)
    columns = {"input_ids": f"ndarray:{signed}", "labels": f"ndarray:{signed}"}
    if ray_workers is not None:  # --ray: the same examples, in the same order, tokenized and written by Ray Data
        common.check_output_empty(out)
        key = f"--dataset ({split})"
        written, dropped = ray_data.write_finetuning(
            load_raw_examples(settings, key), tokenizer, settings, key, out, workers=ray_workers, columns=columns,
            signed=signed, compression=compression, preprocess_records=not args.skip_preprocessing)
        if not written:
            raise ConfigError(f"--dataset: split '{split}' produced no examples")
        print(f"wrote {written} examples ({dropped} dropped by truncation) to {out}")
        return
    log.info("tokenizing split '%s' of %s in %d process(es)", split, name, workers)
    dataset = FinetuningDataset(tokenizer, settings, f"--dataset ({split})", num_workers=workers,
                                preprocess_records=not args.skip_preprocessing)
    common.check_output_empty(out)
    bar = common.Progress(split, total=len(dataset), unit="example")
    writer_out = (os.path.join(args.local, split), out) if args.local is not None else out
    with common.mds_writer(columns, writer_out, compression, keep_local=args.local is not None) as writer:
        for example in dataset.examples:
            writer.write({k: np.asarray(example[k], dtype=signed) for k in columns})
            bar.update(1)
    bar.close()
    if not dataset.examples:
        raise ConfigError(f"--dataset: split '{split}' produced no examples")
    print(f"wrote {len(dataset)} examples ({dataset.num_dropped} dropped by truncation) to {out}")
