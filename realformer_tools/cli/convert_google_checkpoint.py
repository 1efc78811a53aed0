#!/usr/bin/env python
"""Convert one of Google's released RealFormer BERT checkpoints to fairseq.

  python scripts/convert_google_checkpoint.py bert_small.zip --out checkpoints/realformer_bert_small

ZIP_OR_DIR: a released zip (bert_{small,base,large,xlarge}.zip), the folder it unzips to,
or a checkpoint's .index file; it holds bert_config.json, vocab.txt and one TF checkpoint
(*.index, *.data-*). TensorFlow is not needed.

--out receives model.pt (arch realformer_bert_google, task masked_lm), dict.txt (the
WordPiece vocabulary mapped onto fairseq's special symbols), vocab.txt, bert_config.json
and conversion.json (also printed): then

  RealFormerBertModel.from_pretrained(OUT)   # encode, extract_features, fill_mask, predict

or fine-tune with fairseq-train --restore-file OUT/model.pt and the flags in
conversion.json's "finetune_flags" (docs/google_checkpoints.md). Optimizer slots and
global_step are skipped (counted in the summary); any other unknown or missing variable
is an error. Re-running overwrites OUT's files.
"""

import argparse
import logging
import sys

from ._common import input_output_error, run_command


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="ZIP_OR_DIR", help="released zip, its folder, or a checkpoint .index file")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--checkpoint", metavar="NAME",
                   help="the checkpoint's file name prefix (e.g. model.ckpt-1000000), when there are several")
    p.add_argument("--ignore-variables", metavar="REGEX",
                   help="also skip variables whose names match REGEX (default: only optimizer slots "
                        "*/adam_m, */adam_v and global_step)")
    p.add_argument("--no-verify", action="store_true", help="skip the CRC32C check of every tensor")
    p.add_argument("--reader", choices=("builtin", "tensorflow"), default="builtin",
                   help="builtin: this package's reader of TensorFlow's checkpoint format (NumPy only, "
                        "checked against TensorFlow's); tensorflow: TensorFlow's own tf.train.load_checkpoint "
                        "(pip install tensorflow-cpu) (default: builtin)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    def convert():
        from realformer_tools.convert import google_checkpoint

        for package in ("realformer_tools", "realformer_nmt"):  # the converter's progress, the model's
            logging.getLogger(package).setLevel(logging.INFO)
        return google_checkpoint.convert(args.source, args.out, checkpoint=args.checkpoint,
                                         ignore=args.ignore_variables, verify=not args.no_verify, reader=args.reader)

    return run_command("convert_google_checkpoint.py", convert, problem=input_output_error(args.source, args.out))


if __name__ == "__main__":
    sys.exit(main())
