"""Raw text as documents, WikiText's layout included.

Two layouts are recognised:

* **WikiText** (``wiki.*.tokens`` / the ``{train,valid,test}.txt`` copies of it): every
  article starts with a title line `` = Title = ``; sections are `` = = Section = = ``,
  `` = = = Sub = = = ``; blank lines separate *paragraphs*, not articles. A file with at
  least one title line is split at titles; headings are dropped (they are not sentences)
  and blank lines ignored.
* **Plain text**: one sentence or paragraph per line, documents separated by one or more
  empty lines (the input convention of BERT's ``create_pretraining_data.py``).

The literal ``<unk>`` of WikiText (an out-of-vocabulary word) is kept as it is; the
SentencePiece step maps it to fairseq's ``<unk>`` (see ``pretraining``).
"""

import os
import re

from realformer_nmt.errors import DataError

from .pipeline import read_text_lines

_HEADING = re.compile(r"((?:= )+)(.*?)((?: =)+)")


def heading_level(line: str) -> int:
    """1 for ``= Title =``, 2 for ``= = Section = =``, ...; 0 for a text line.

    ``line`` has its whitespace collapsed (as ``read_text_lines`` returns it)."""
    m = _HEADING.fullmatch(line)
    if m is None or not m.group(2).strip():
        return 0
    left, right = m.group(1).count("="), m.group(3).count("=")
    return left if left == right else 0


def split_documents(lines):
    """``lines`` -> (documents, stats); a document is a list of non-empty text lines.

    Split at WikiText title lines when the text has any, else at empty lines."""
    by_titles = any(heading_level(line) == 1 for line in lines)
    documents, current = [], []
    headings = 0

    def close():
        if current:
            documents.append(list(current))
            current.clear()

    for line in lines:
        level = heading_level(line) if line else 0
        if level:
            headings += 1
            if level == 1:
                close()
            continue
        if not line:
            if not by_titles:
                close()
            continue
        current.append(line)
    close()
    stats = {
        "documents_by": "wikitext_titles" if by_titles else "empty_lines",
        "lines": len(lines),
        "documents": len(documents),
        "text_lines": sum(len(d) for d in documents),
        "headings_dropped": headings,
        "words": sum(len(line.split()) for d in documents for line in d),
    }
    return documents, stats


def read_documents(path, flag="--raw-dir"):
    """Documents of a raw text file (plain or gzipped); DataError on a missing, empty or
    non-UTF-8 file. ``flag`` names the option the path came from, for the message."""
    if not os.path.isfile(path):
        raise DataError(f"{path} not found ({flag})")
    lines, bad = read_text_lines(path)
    if bad:
        raise DataError(f"{path} is not valid UTF-8 ({bad} line{'s' if bad > 1 else ''} with invalid bytes)")
    documents, stats = split_documents(lines)
    if not documents:
        raise DataError(f"{path} has no text (it is empty, or holds only blank lines and headings)")
    return documents, stats
