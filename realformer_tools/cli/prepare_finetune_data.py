#!/usr/bin/env python
"""Prepare a labelled TSV for fine-tuning a pre-trained encoder (--task sentence_prediction).

  python scripts/prepare_finetune_data.py --pretrained-data data-bin/wikitext2_mlm \
      --train rte/train.tsv --valid rte/valid.tsv --out data-bin/rte

Each TSV line is `sentence<TAB>label` or, for sentence pairs, `sentence1<TAB>sentence2<TAB>label`
(every line of every file the same; --skip-header drops a first line of column names). The
sentences are encoded with the pre-training data's spm.model and binarized with its dict.txt
(the model's own vocabulary) into OUT/input0/ (and OUT/input1/ for pairs); labels are
binarized into OUT/label/ with a dictionary of their own (classification), or written as
OUT/label/{split}.label with one number per line (--regression). OUT is the data dir of
`fairseq-train --task sentence_prediction` (see docs/bert.md#fine-tuning); the number of
classes is printed in the JSON summary, for --num-classes.

An offline example task instead of TSVs (GLUE needs a download): word order on Multi30k's
English captions, each caption as written (`original`) or with its words shuffled
(`shuffled`), half each; train / valid / test from train, val and test_2016_flickr:

  python scripts/prepare_finetune_data.py --pretrained-data data-bin/wikitext2_mlm \
      --multi30k ../shared/data/multi30k --out data-bin/caption_order
"""

import argparse
import logging
import os
import sys

from ._common import emit_json

NAME = "prepare_finetune_data.py"


class InputError(Exception):
    """A missing or malformed input: printed as one line, exit status 2."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained-data", required=True,
                   help="the pre-training data dir (dict.txt and spm.model, from prepare_pretraining_data.py)")
    p.add_argument("--train", help="training TSV (required unless --multi30k)")
    p.add_argument("--valid", help="validation TSV (required unless --multi30k)")
    p.add_argument("--test", help="test TSV (optional; labels required as in the others)")
    p.add_argument("--multi30k", metavar="DIR",
                   help="instead of TSVs: the offline example task, word order on the English captions of "
                        "Multi30k in DIR (train, val, test_2016_flickr .en[.gz]): each caption lower-cased, "
                        "without its final '.', as written (label original) or with its words shuffled "
                        "(label shuffled), half each; the TSVs it makes are kept in OUT/tsv/")
    p.add_argument("--seed", type=int, default=1,
                   help="--multi30k: which captions are shuffled, and how (default: %(default)s)")
    p.add_argument("--out", required=True, help="output data dir (input0/, input1/ for pairs, label/)")
    p.add_argument("--regression", action="store_true",
                   help="labels are numbers (--regression-target --num-classes 1): written as .label files")
    p.add_argument("--skip-header", action="store_true", help="drop the first line of every TSV")
    p.add_argument("--json", help="also write the summary to this file")
    return p.parse_args(argv)


def read_tsv(path, skip_header, regression):
    """[(sentences, label)] from one TSV file; InputError naming the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    rows = []
    for number, line in enumerate(lines[1:] if skip_header else lines, start=2 if skip_header else 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3):
            raise InputError(f"{path}:{number}: expected `sentence<TAB>label` or `sentence1<TAB>sentence2"
                             f"<TAB>label`, got {len(fields)} tab-separated field(s)")
        if not all(f.strip() for f in fields):
            raise InputError(f"{path}:{number}: an empty field")
        label = fields[-1].strip()
        if regression:
            try:
                float(label)
            except ValueError:
                raise InputError(f"{path}:{number}: --regression label {label!r} is not a number") from None
        elif " " in label:
            raise InputError(f"{path}:{number}: label {label!r} has a space (labels are one token)")
        rows.append(([f.strip() for f in fields[:-1]], label))
    if not rows:
        raise InputError(f"{path}: no labelled lines")
    return rows


def check_sources(args):
    """One line when the TSV flags and --multi30k are mixed or missing."""
    if args.multi30k is not None:
        given = [f"--{name}" for name in ("train", "valid", "test") if getattr(args, name)]
        given += ["--regression"] if args.regression else []
        given += ["--skip-header"] if args.skip_header else []
        if given:
            raise InputError(f"--multi30k makes its own splits and labels: drop {', '.join(given)}")
    else:
        missing = [f"--{name}" for name in ("train", "valid") if not getattr(args, name)]
        if missing:
            raise InputError(f"give {' and '.join(missing)} (labelled TSVs), or --multi30k DIR for the "
                             "offline example task")


def caption_tables(args):
    """The --multi30k word-order task as TSV tables, also written to OUT/tsv/{split}.tsv."""
    logging.basicConfig(format="%(message)s", level=logging.WARNING)  # quiets fairseq's import-time INFO
    from realformer_nmt.errors import DataError
    from realformer_tools.data import caption_order

    try:
        tables, report = caption_order.word_order_task(args.multi30k, seed=args.seed)
    except DataError as exc:
        raise InputError(str(exc)) from None
    tsv = os.path.join(args.out, "tsv")
    os.makedirs(tsv, exist_ok=True)
    for split, rows in tables.items():
        write_lines(os.path.join(tsv, f"{split}.tsv"), [f"{sentence}\t{label}" for sentence, label in rows])
    return {split: [([sentence], label) for sentence, label in rows] for split, rows in tables.items()}, report


def prepare(args):
    check_sources(args)
    data = args.pretrained_data
    for name in ("dict.txt", "spm.model"):
        if not os.path.isfile(os.path.join(data, name)):
            raise InputError(f"--pretrained-data {data}: no {name} (the data dir prepare_pretraining_data.py wrote)")
    if args.multi30k is not None:
        tables, example = caption_tables(args)
        splits = {split: os.path.join(args.out, "tsv", f"{split}.tsv") for split in tables}
        return dict(write_checked(args, tables, splits), example=dict(task="multi30k word order", **example))
    splits = {"train": args.train, "valid": args.valid}
    if args.test:
        splits["test"] = args.test
    tables = {split: read_tsv(path, args.skip_header, args.regression) for split, path in splits.items()}
    return write_checked(args, tables, splits)


def write_checked(args, tables, splits):
    """Check that the tables agree (sentences per line, labels), then write OUT."""
    widths = {split: {len(s) for s, _ in rows} for split, rows in tables.items()}
    inputs = next(iter(widths["train"]))
    for split, found in widths.items():
        if found != {inputs}:
            raise InputError(f"{splits[split]}: mixes or differs in the number of sentences per line "
                             f"({' and '.join(map(str, sorted(found | {inputs})))}); every line needs the same")
    if not args.regression:
        known = {label for _, label in tables["train"]}
        for split, rows in tables.items():
            unseen = sorted({label for _, label in rows} - known)
            if unseen:
                raise InputError(f"{splits[split]}: label(s) {', '.join(unseen[:5])} never occur in --train")

    logging.basicConfig(format="%(message)s", level=logging.WARNING)  # quiets fairseq's import-time INFO
    from realformer_nmt.errors import DataError

    try:
        return write_data_dir(args, tables, inputs)
    except DataError as exc:
        raise InputError(str(exc)) from None


def write_data_dir(args, tables, inputs):
    import sentencepiece as spm

    from realformer_tools.data import pipeline

    data = args.pretrained_data

    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "spm.model"))
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    for k in range(inputs):
        for split, rows in tables.items():
            encoded = sp.encode([sentences[k] for sentences, _ in rows], out_type=str)
            write_lines(os.path.join(work, f"{split}.input{k}"), [" ".join(p) for p in encoded])
        dest = os.path.join(args.out, f"input{k}")
        reset(dest)
        pipeline.fairseq_preprocess("--only-source", "--srcdict", os.path.join(data, "dict.txt"),
                                    "--destdir", dest, "--workers", 1,
                                    *split_flags(work, f"input{k}", tables))
    label_dir = os.path.join(args.out, "label")
    reset(label_dir)
    for split, rows in tables.items():
        path = os.path.join(label_dir if args.regression else work, f"{split}.label")
        write_lines(path, [label for _, label in rows])
    if not args.regression:
        pipeline.fairseq_preprocess("--only-source", "--destdir", label_dir, "--workers", 1,
                                    *split_flags(work, "label", tables))
    classes = sorted({label for _, label in tables["train"]})
    return {
        "out": os.path.abspath(args.out),
        "inputs": inputs,
        "task": "regression" if args.regression else "classification",
        "num_classes": 1 if args.regression else len(classes),
        "classes": None if args.regression else classes,
        "lines": {split: len(rows) for split, rows in tables.items()},
        "dictionary": os.path.abspath(os.path.join(data, "dict.txt")),
    }


def split_flags(work, suffix, tables):
    flag = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    return [w for split in tables for w in (flag[split], os.path.join(work, f"{split}.{suffix}"))]


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def reset(folder):
    """An output folder without an earlier run's dict.txt (fairseq-preprocess refuses to overwrite it)."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.remove(path)


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = prepare(args)
    except InputError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    emit_json(summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
