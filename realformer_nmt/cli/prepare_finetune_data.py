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
    p.add_argument("--train", required=True, help="training TSV")
    p.add_argument("--valid", required=True, help="validation TSV")
    p.add_argument("--test", help="test TSV (optional; labels required as in the others)")
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


def prepare(args):
    data = args.pretrained_data
    for name in ("dict.txt", "spm.model"):
        if not os.path.isfile(os.path.join(data, name)):
            raise InputError(f"--pretrained-data {data}: no {name} (the data dir prepare_pretraining_data.py wrote)")
    splits = {"train": args.train, "valid": args.valid}
    if args.test:
        splits["test"] = args.test
    tables = {split: read_tsv(path, args.skip_header, args.regression) for split, path in splits.items()}
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

    from realformer_nmt.data import pipeline

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
