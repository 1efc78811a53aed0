"""Multi30k task 1 (image descriptions in English, German and French; any two of them in
either direction): train / val / test_2016_flickr, and the two 2017 test sets
(test_2017_flickr, test_2017_mscoco: COCO images, out of domain) as the extra fairseq splits
``test1`` / ``test2``, from a local copy (plain or ``.gz``, e.g. ``../shared/data/multi30k``)
or from the official GitHub repository (``--download``: ``data/task1/raw/`` holds all five)."""

import os
import shutil
import sys
import urllib.error
import urllib.request

from realformer_nmt.errors import DataError

from .pipeline import LANGS, read_parallel, write_split

MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# further test sets, binarized with the same dictionaries as fairseq splits test1, test2 (the
# headline stays ``test``: test_2016_flickr); a local copy without them leaves them out
EXTRA_TEST_FILES = {"test1": "test_2017_flickr", "test2": "test_2017_mscoco"}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"


def where_to_get_it(langs=LANGS):
    """The two ways to give Multi30k, which every error about a missing copy names."""
    files = ", ".join(f"{name}.{lang}" for name in MULTI30K_FILES.values() for lang in langs)
    return (f"give --download (fetches the official files from github.com/multi30k/dataset) or --raw-dir "
            f"a folder holding them: {files} (plain or .gz)")


def _find_raw_file(raw_dir, name, lang, langs=LANGS, required=True):
    for candidate in (f"{name}.{lang}", f"{name}.{lang}.gz"):
        path = os.path.join(raw_dir, candidate)
        if os.path.isfile(path):
            return path
    if not required:
        return None
    raise DataError(f"--raw-dir {raw_dir} has no {name}.{lang}[.gz]: {where_to_get_it(langs)}")


def _download(name, lang, dest_dir, required=True):
    url = MULTI30K_URL.format(name=name, lang=lang)
    path = os.path.join(dest_dir, f"{name}.{lang}.gz")
    print(f"downloading {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(path + ".part", "wb") as f:
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError) as exc:
        if not required:
            print(f"warning: could not download {url}: {exc}; that test set is left out", file=sys.stderr)
            return None
        raise DataError(f"could not download {url}: {exc} (use --raw-dir with a local copy)") from exc
    os.replace(path + ".part", path)
    return path


MULTI30K_LANGS = ("en", "de", "fr")


def check_langs(langs):
    """One-line error unless ``langs`` are two different Multi30k languages."""
    src, tgt = langs
    for flag, lang in (("--src", src), ("--tgt", tgt)):
        if lang not in MULTI30K_LANGS:
            raise DataError(f"{flag} {lang!r}: Multi30k has {', '.join(MULTI30K_LANGS)}")
    if src == tgt:
        raise DataError(f"--src and --tgt are both {src!r}: give two different languages")


def check_multi30k_source(raw_dir=None, download=False, langs=LANGS):
    """Fail early (before anything is written) when there is nowhere to read Multi30k from."""
    check_langs(langs)
    if raw_dir is None and not download:
        raise DataError(f"Multi30k needs a source: {where_to_get_it(langs)}")
    if raw_dir is not None and not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir} is not a directory: {where_to_get_it(langs)}")
    if raw_dir is not None:
        for name in MULTI30K_FILES.values():
            for lang in langs:
                _find_raw_file(raw_dir, name, lang, langs)


def load_multi30k(out_dir, raw_dir=None, download=False, langs=LANGS):
    """Write Multi30k task 1 as ``{train,valid,test}.{src,tgt}``; return a per-split report."""
    check_multi30k_source(raw_dir, download, langs)
    os.makedirs(out_dir, exist_ok=True)
    report = {}
    for split, name in MULTI30K_FILES.items():
        if raw_dir is not None:
            paths = [_find_raw_file(raw_dir, name, lang, langs) for lang in langs]
        else:
            paths = [_download(name, lang, out_dir) for lang in langs]
        pairs, report[split] = read_parallel(*paths)
        write_split(out_dir, split, pairs, langs)
        for path, bad in report[split]["non_utf8_lines"].items():
            if bad:
                print(f"warning: {path}: {bad} lines had invalid UTF-8 (replaced with U+FFFD)",
                      file=sys.stderr)
        if report[split]["dropped_empty"]:
            print(f"warning: {split}: dropped {report[split]['dropped_empty']} pairs with an empty side",
                  file=sys.stderr)
    return report


def load_extra_test_sets(out_dir, raw_dir=None, download=False, langs=LANGS):
    """Write the 2017 test sets found in ``raw_dir`` (or downloaded) as ``test1.<lang>``,
    ``test2.<lang>`` (``EXTRA_TEST_FILES``) in ``out_dir``; returns ``({split: name}, report)``
    for those written. A set missing on either side is left out with a note on stderr."""
    check_langs(langs)
    os.makedirs(out_dir, exist_ok=True)
    written, report = {}, {}
    for split, name in EXTRA_TEST_FILES.items():
        if raw_dir is not None:
            paths = [_find_raw_file(raw_dir, name, lang, required=False) for lang in langs]
        else:
            paths = [_download(name, lang, out_dir, required=False) for lang in langs]
        if None in paths:
            print(f"note: {name}.{{{','.join(langs)}}} not found in {raw_dir or 'the download'}: that test set "
                  "is left out", file=sys.stderr)
            continue
        pairs, report[split] = read_parallel(*paths)
        write_split(out_dir, split, pairs, langs)
        written[split] = name
    return written, report
