#!/usr/bin/env python
"""Prepare a translation corpus for fairseq: raw text -> joint SentencePiece -> binaries
(IWSLT'14: fairseq's own recipe, Moses tokens and subword-nmt BPE).

  python scripts/prepare_data.py                                  # synthetic En->De demo corpus
  python scripts/prepare_data.py --corpus own --raw-dir raw --src en --tgt de --dest work/data  # your own files
  python scripts/prepare_data.py --corpus multi30k --raw-dir ../shared/data/multi30k
  python scripts/prepare_data.py --corpus multi30k --raw-dir ../shared/data/multi30k --src en --tgt fr
  python scripts/prepare_data.py --corpus multi30k --download     # from github.com/multi30k
  python scripts/prepare_data.py --corpus iwslt14 --download      # De->En, fairseq's de-en.tgz
  python scripts/prepare_data.py --corpus iwslt14 --raw-dir DIR   # DIR holds de-en.tgz or de-en/

--dest (default data-bin/multi30k_<src>_<tgt>) gets dict.{src,tgt}.txt,
{train,valid,test}.<src>-<tgt>.{src,tgt}.{bin,idx}, spm.model and prepare.json, which
records the languages, the BPE to remove, the BLEU convention, the raw test files and
the target/source length ratio (raw and SentencePiece files go to --dest/work). Generate
with ``--remove-bpe sentencepiece`` to score detokenized output.

Multi30k's test split is test_2016_flickr; test_2017_flickr and test_2017_mscoco (when the
raw folder or the download has them) become the fairseq splits test1 and test2, binarized
with the same dictionaries and SentencePiece model after the others (which they do not
change); prepare.json names them ("test_sets", "test_set_files"), and compare_backbones.py
scores every run on each. A folder prepared before gets them without any of its files
being rewritten (safe while trainings read it):

  python scripts/prepare_data.py --corpus multi30k --raw-dir ../shared/data/multi30k --add-test-sets

--corpus own reads your files, DIR/{train,valid,test}.{src,tgt} (plain or .gz; any language
codes), line n of the two files of a split a translation pair. Every file is checked first,
each problem one line and nothing written: a missing file, text that is not UTF-8 (file,
line and byte named), two files of a split with different line counts (both named, both
counts). Train and valid drop pairs with an empty side (counted in prepare.json); test keeps
every line, so that the hypotheses line up with your own reference file. SentencePiece uses
the identity normalization: decoding gives back every character seen in training as written
(its default, NFKC, rewrites ``…``, ``ﬁ``, ``½``, which a reference then keeps).

--corpus iwslt14 reproduces fairseq's examples/translation/prepare-iwslt14.sh in Python
(sacremoses for tokenizer.perl and lowercase.perl, clean-corpus-n.perl's rules, subword-nmt
with --bpe-merges merges learned on both sides): --dest (default
data-bin/iwslt14.tokenized.de-en) gets the binaries with separate dictionaries, the BPE
``code`` and prepare.json (bpe subword_nmt, bleu tokenized); the tokenized text is in
--dest/work/bpe, the raw test <seg> text in --dest/work/tok/test.raw.{de,en}. Generate with
``--remove-bpe`` and fairseq's default scorer for the BLEU papers report.
"""

import argparse
import os
import sys

from ._common import run_command

DEFAULT_DEST = {"synthetic": os.path.join("data-bin", "demo_en_de"),
                "multi30k": os.path.join("data-bin", "multi30k_{src}_{tgt}"),
                "iwslt14": os.path.join("data-bin", "iwslt14.tokenized.de-en"),
                "own": os.path.join("data-bin", "own_{src}_{tgt}")}
MULTI30K_LANGS = ("en", "de", "fr")
DEFAULT_LANGS = {"synthetic": ("en", "de"), "multi30k": ("en", "de"), "iwslt14": ("de", "en"), "own": ("en", "de")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=sorted(DEFAULT_DEST), default="synthetic",
                   help="which corpus (default: %(default)s)")
    p.add_argument("--raw-dir", help="multi30k: directory with {train,val,test_2016_flickr}.{src,tgt}[.gz]; "
                                     "iwslt14: directory holding de-en.tgz or its extracted de-en/ folder; "
                                     "own: directory with {train,valid,test}.{src,tgt}[.gz]")
    p.add_argument("--src", help="source language (multi30k: en, de or fr, default en; own: the files' suffix, "
                                 "default en; iwslt14 is de->en only)")
    p.add_argument("--tgt", help="target language (multi30k: en, de or fr, default de; own: default de)")
    p.add_argument("--download", action="store_true",
                   help="multi30k: fetch the raw files from GitHub; iwslt14: fetch fairseq's de-en.tgz")
    p.add_argument("--dest", help="output directory (default: data-bin/demo_en_de, data-bin/multi30k_<src>_<tgt>, "
                                  "data-bin/iwslt14.tokenized.de-en or data-bin/own_<src>_<tgt>)")
    p.add_argument("--work-dir", help="raw and SentencePiece (iwslt14: tokenized and BPE) files (default: DEST/work)")
    p.add_argument("--vocab-size", type=int,
                   help="joint SentencePiece vocabulary (default: 1000 synthetic, 8000 multi30k and own; a small "
                        "corpus gets fewer pieces, as many as it has)")
    p.add_argument("--bpe-merges", type=int,
                   help="iwslt14: subword-nmt merges learned on both sides (default: 10000, the recipe's)")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="iwslt14: Moses tokenizer and fairseq-preprocess processes (default: %(default)s)")
    p.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe",
                   help="SentencePiece model type (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="synthetic: generator seed (default: %(default)s)")
    p.add_argument("--n-train", type=int, default=20000, help="synthetic: training pairs (default: %(default)s)")
    p.add_argument("--add-test-sets", action="store_true",
                   help="multi30k: add test_2017_flickr / test_2017_mscoco (splits test1, test2) to the already "
                        "prepared --dest with its own dictionaries and spm.model; existing files are not "
                        "rewritten, prepare.json is replaced atomically with the same record plus the new sets")
    p.add_argument("--json", help="also write the summary to this file (it is always printed)")
    args = p.parse_args(argv)
    args.langs_given = args.src is not None or args.tgt is not None
    default_src, default_tgt = DEFAULT_LANGS[args.corpus]
    args.src, args.tgt = args.src or default_src, args.tgt or default_tgt
    args.dest = args.dest or DEFAULT_DEST[args.corpus].format(src=args.src, tgt=args.tgt)
    return args


def check_args(args):
    """One sentence about the first inconsistent flag, or None."""
    if args.add_test_sets and args.corpus != "multi30k":
        return "--add-test-sets only applies to --corpus multi30k (its 2017 test sets)"
    if args.add_test_sets and (args.vocab_size is not None or args.model_type != "bpe"):
        return "--add-test-sets uses the prepared folder's own SentencePiece model: drop --vocab-size/--model-type"
    if args.add_test_sets and not os.path.isfile(os.path.join(args.dest, "prepare.json")):
        return f"--add-test-sets: {args.dest} has no prepare.json: prepare it first (without --add-test-sets)"
    if args.corpus == "synthetic" and (args.raw_dir or args.download):
        return "--raw-dir and --download only apply to --corpus multi30k, iwslt14 and own"
    if args.corpus == "own" and args.download:
        return "--corpus own reads your files: give --raw-dir DIR, not --download"
    if args.corpus == "own" and not args.raw_dir:
        return "--corpus own needs --raw-dir DIR, the folder of your {train,valid,test}.{src,tgt} files"
    if args.corpus == "multi30k":
        for flag, lang in (("--src", args.src), ("--tgt", args.tgt)):
            if lang not in MULTI30K_LANGS:
                return f"{flag} {lang!r}: Multi30k has {', '.join(MULTI30K_LANGS)}"
    if args.corpus == "iwslt14" and args.langs_given and (args.src, args.tgt) != ("de", "en"):
        return "--corpus iwslt14 is German->English only (fairseq's recipe): drop --src/--tgt"
    if args.corpus == "iwslt14" and args.vocab_size is not None:
        return "--vocab-size is a SentencePiece setting: --corpus iwslt14 takes --bpe-merges"
    if args.corpus != "iwslt14" and args.bpe_merges is not None:
        return "--bpe-merges is a subword-nmt setting of --corpus iwslt14 (others take --vocab-size)"
    if args.bpe_merges is not None and args.bpe_merges < 1:
        return f"--bpe-merges must be positive, not {args.bpe_merges}"
    if args.workers < 1:
        return f"--workers must be at least 1, not {args.workers}"
    if args.corpus == "synthetic" and (args.src, args.tgt) != ("en", "de"):
        return "--corpus synthetic is English->German only: drop --src/--tgt"
    if args.src == args.tgt:
        return f"--src and --tgt are both {args.src!r}: give two different languages"
    if args.raw_dir and args.download:
        return "use either --raw-dir or --download, not both"
    if args.corpus in ("multi30k", "iwslt14") and not (args.raw_dir or args.download or args.add_test_sets):
        return f"--corpus {args.corpus} needs --raw-dir DIR (a local copy) or --download"
    # a --raw-dir that is missing or lacks a file: the corpus module says which files and where to
    # get them (realformer_tools/data/multi30k.py, iwslt14.py), before anything is written
    if args.n_train < 1:
        return "--n-train must be positive"
    return None


def main(argv=None):
    args = parse_args(argv)

    def prepare():
        from realformer_tools.data import corpora

        if args.add_test_sets:
            return corpora.add_test_sets(args.dest, raw_dir=args.raw_dir, download=args.download)

        sizes = {"n_train": args.n_train} if args.n_train != 20000 else None
        return corpora.prepare(args.corpus, args.dest, raw_dir=args.raw_dir, download=args.download,
                               vocab_size=args.vocab_size, work_dir=args.work_dir, seed=args.seed,
                               synthetic_sizes=sizes, model_type=args.model_type, src=args.src, tgt=args.tgt,
                               bpe_merges=args.bpe_merges, workers=args.workers)

    return run_command("prepare_data.py", prepare, problem=check_args(args), json_path=args.json)


if __name__ == "__main__":
    sys.exit(main())
