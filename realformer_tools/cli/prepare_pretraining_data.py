#!/usr/bin/env python
"""Prepare raw text for encoder pre-training: documents -> SentencePiece -> fairseq binaries.

  python scripts/prepare_pretraining_data.py --raw-dir ../shared/data/wikitext-2 --out data-bin/wikitext2_mlm

--raw-dir holds one sentence or paragraph per line, documents separated by empty lines
or WikiText ` = Title = ` headings. Training text: train.txt (or wiki.train.tokens), and
when there is none test.txt (or wiki.test.tokens): the WikiText-2 copy in shared/data has
only test.txt and valid.txt. Validation text: valid.txt (or wiki.valid.tokens).

--out is a data dir for `fairseq-train --task masked_lm` and `--task masked_lm_nsp`:
dict.txt, train.{bin,idx}, valid.{bin,idx}, spm.model (for --bpe sentencepiece and the
hub interface) and prepare.json. dict.txt lists every piece of spm.model (--full-vocabulary,
the default), so a model trained on OUT exports with scripts/export_hf.py. Re-running
resumes an interrupted run and does nothing when the inputs and settings are unchanged.
The summary is printed as JSON.
"""

import argparse
import sys

from ._common import run_command


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw-dir", required=True, help="directory with the raw text files")
    p.add_argument("--out", required=True, help="output data dir")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="SentencePiece vocabulary size (default: %(default)s)")
    p.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe",
                   help="SentencePiece model type (default: %(default)s)")
    p.add_argument("--train-file", help="training text, relative to --raw-dir (default: train.txt, "
                                        "wiki.train.tokens, test.txt or wiki.test.tokens, the first that exists)")
    p.add_argument("--valid-file", help="validation text, relative to --raw-dir (default: valid.txt "
                                        "or wiki.valid.tokens)")
    p.add_argument("--work-dir", help="intermediate text and piece files (default: OUT/work)")
    p.add_argument("--full-vocabulary", action=argparse.BooleanOptionalAction, default=True,
                   help="dict.txt holds every SentencePiece piece (those the train text never produced with "
                        "count 0, after fairseq's own entries, whose ids do not change), so the model's "
                        "vocabulary is the SentencePiece model's: new text (fine-tuning data) never becomes "
                        "<unk> for a piece the train text lacked, and the model exports to Hugging Face with "
                        "its tokenizer (scripts/export_hf.py). Default on; --no-full-vocabulary keeps only "
                        "the pieces of the train text (fairseq-preprocess's own dictionary, the one the "
                        "committed results in docs/results.md used)")
    p.add_argument("--json", help="also write the summary to this file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    def prepare():
        from realformer_tools.data import pretraining

        return pretraining.prepare_pretraining(
            args.raw_dir, args.out, vocab_size=args.vocab_size, work_dir=args.work_dir,
            train_file=args.train_file, valid_file=args.valid_file, model_type=args.model_type,
            full_vocabulary=args.full_vocabulary,
        )

    return run_command("prepare_pretraining_data.py", prepare, json_path=args.json)  # a bad --raw-dir: pretraining.py


if __name__ == "__main__":
    sys.exit(main())
