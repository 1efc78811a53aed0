"""An offline fine-tuning example made from Multi30k's English captions: word order.

Each caption is shown either as written (label ``original``) or with its words in a
random other order (label ``shuffled``), one or the other, half each: a single-sentence
classification that a bag of words cannot solve (both classes have the same words) and a
model of English word order can. Built from a local Multi30k copy (``train``, ``val``,
``test_2016_flickr``; plain or ``.gz``), so it needs no download, unlike GLUE.

Both classes get the same surface: lower case (a capital would mark the first word) and
no final ``.`` (it would mark the last); a caption with fewer than three words (no other
order that reads differently often enough) is left out. The draw is seeded: the same
seed gives the same rows.
"""

import os
import random

from realformer_nmt.errors import DataError

from .multi30k import MULTI30K_FILES
from .pipeline import read_text_lines

LABELS = ("original", "shuffled")
MIN_WORDS = 3


def normalize(caption):
    """The caption as both classes show it: lower case, single spaces, no final ``.``."""
    words = caption.lower().split()
    if words and words[-1].endswith("."):
        words[-1] = words[-1].rstrip(".")
        if not words[-1]:
            words.pop()
    return words


def shuffled(words, rng):
    """``words`` in a random order that differs from the given one (``words`` must hold two
    different words)."""
    order = list(words)
    while order == words:
        rng.shuffle(order)
    return order


def caption_rows(captions, seed):
    """``[(sentence, label)]``: every usable caption once, as written or shuffled (half
    each, in a seeded random order of which is which); and the number left out."""
    rng = random.Random(seed)
    usable = [w for w in map(normalize, captions) if len(w) >= MIN_WORDS and len(set(w)) > 1]
    labels = [LABELS[i % 2] for i in range(len(usable))]
    rng.shuffle(labels)
    rows = [(" ".join(shuffled(w, rng) if label == "shuffled" else w), label) for w, label in zip(usable, labels)]
    return rows, len(captions) - len(usable)


def english_captions_file(raw_dir, name, flag="--multi30k"):
    """``raw_dir/name.en`` or ``.en.gz``; DataError naming ``flag`` when neither is there."""
    if not os.path.isdir(raw_dir):
        raise DataError(f"{flag} {raw_dir} is not a directory")
    for candidate in (f"{name}.en", f"{name}.en.gz"):
        path = os.path.join(raw_dir, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"{flag} {raw_dir} has no {name}.en or {name}.en.gz (Multi30k's English captions)")


def word_order_task(raw_dir, seed=1, flag="--multi30k"):
    """``({split: [(sentence, label)]}, report)`` for train / valid / test from the English
    captions of Multi30k in ``raw_dir``; DataError (one line naming the file or ``flag``).
    Every file is found before any is read."""
    tables, report = {}, {"seed": seed, "dropped_short": {}, "labels": {}}
    paths = {split: english_captions_file(raw_dir, name, flag) for split, name in MULTI30K_FILES.items()}
    for split, path in paths.items():
        captions, _ = read_text_lines(path)
        captions = [c for c in captions if c.strip()]
        if not captions:
            raise DataError(f"{path}: no captions")
        tables[split], report["dropped_short"][split] = caption_rows(captions, seed + len(report["labels"]))
        if not tables[split]:
            raise DataError(f"{path}: no caption has {MIN_WORDS} or more words")
        report["labels"][split] = {label: sum(r[1] == label for r in tables[split]) for label in LABELS}
    return tables, report
