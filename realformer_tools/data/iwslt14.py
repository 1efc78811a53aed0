"""IWSLT'14 German->English as fairseq prepares it (``examples/translation/prepare-iwslt14.sh``),
with maintained Python libraries in place of its Perl scripts.

The steps, each as the script does it:

1. **train**: from ``train.tags.de-en.{de,en}``, lines containing ``<url>``, ``<talkid>`` or
   ``<keywords>`` are dropped and the ``<title>``/``<description>`` tags are removed (their
   text stays a training line); Moses tokenization (``sacremoses``, ``-l de`` / ``-l en``,
   special characters escaped as ``tokenizer.perl`` does, with its final-dot rule); Moses ``clean-corpus-n.perl
   -ratio 1.5 ... 1 175`` (``clean_corpus``); lowercasing.
2. **valid** is every 23rd line of that cleaned training text; **train** is the rest.
3. **test**: the ``<seg id="N">`` lines of ``IWSLT14.TED.dev2010``, ``IWSLT14.TEDX.dev2012``,
   ``IWSLT14.TED.tst2010``, ``tst2011``, ``tst2012`` (``.de-en.<lang>.xml``), in that order,
   with ``’`` turned into ``'``, tokenized and lowercased (not cleaned).
4. ``subword-nmt``: ``learn_bpe`` with 10,000 merges on ``train.de`` + ``train.en`` together,
   applied to every split.
5. ``fairseq-preprocess --source-lang de --target-lang en`` (separate dictionaries, as in
   fairseq's README).

Besides, the test ``<seg>`` text before tokenization (``test.raw.{de,en}``) is kept: the
references of the sacreBLEU score reported beside the tokenized BLEU.
"""

import json
import multiprocessing
import os
import re
import shutil
import sys
import tarfile
import urllib.error
import urllib.request

from realformer_nmt.errors import DataError

from .pipeline import SPLITS, count_lines, dictionary_size, fairseq_preprocess, log

SRC, TGT = "de", "en"
LANG_PAIR = "de-en"
IWSLT14_URL = "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"  # the script's URL
ARCHIVE = "de-en.tgz"
TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012")
DROPPED_TAGS = ("<url>", "<talkid>", "<keywords>")  # grep -v
REMOVED_TAGS = ("<title>", "</title>", "<description>", "</description>")  # sed -e 's/<title>//g' ...
VALID_EVERY = 23
BPE_MERGES = 10000
MIN_LEN, MAX_LEN, MAX_RATIO, MAX_WORD_LENGTH = 1, 175, 1.5, 1000  # clean-corpus-n.perl -ratio 1.5 ... 1 175


def train_file(lang):
    return f"train.tags.{LANG_PAIR}.{lang}"


def test_file(name, lang):
    return f"{name}.{LANG_PAIR}.{lang}.xml"


def needed_files():
    return [train_file(lang) for lang in (SRC, TGT)] + [test_file(n, lang) for n in TEST_SETS for lang in (SRC, TGT)]


# --------------------------------------------------------------------------------------
# Finding the raw files: an extracted de-en/ folder, the archive, or a download
# --------------------------------------------------------------------------------------

def _has_files(folder):
    return all(os.path.isfile(os.path.join(folder, n)) for n in needed_files())


def _missing(folder):
    return [n for n in needed_files() if not os.path.isfile(os.path.join(folder, n))]


def check_iwslt14_source(raw_dir=None, download=False):
    """Fail early (before anything is written) when there is nowhere to read IWSLT'14 from."""
    if raw_dir is None and not download:
        raise DataError(f"--corpus iwslt14 needs --raw-dir DIR (holding {ARCHIVE} or its extracted "
                        f"{LANG_PAIR}/ folder) or --download")
    if raw_dir is not None and download:
        raise DataError("use either --raw-dir or --download, not both")
    if raw_dir is not None:
        if not os.path.isdir(raw_dir):
            raise DataError(f"--raw-dir {raw_dir} is not a directory: give --download (fetches fairseq's {ARCHIVE}) "
                            f"or --raw-dir a folder holding {ARCHIVE} or its extracted {LANG_PAIR}/ folder")
        if not any(os.path.exists(p) for p in (os.path.join(raw_dir, LANG_PAIR), os.path.join(raw_dir, ARCHIVE),
                                                os.path.join(raw_dir, train_file(SRC)))):
            raise DataError(f"--raw-dir {raw_dir} holds neither {ARCHIVE} nor a {LANG_PAIR}/ folder")


def _extract(archive, dest):
    """Extract the ``de-en/`` files of ``archive`` into ``dest``; return ``dest/de-en``."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.split("/")[0] == LANG_PAIR
                       and ".." not in m.name.split("/")]  # plain files under de-en/ only
            if not members:
                raise DataError(f"{archive} has no {LANG_PAIR}/ folder: is it IWSLT'14's {ARCHIVE}?")
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12 / 3.9.17
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"cannot extract {archive}: {exc}") from exc
    return os.path.join(dest, LANG_PAIR)


def _download(dest):
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, ARCHIVE)
    log(f"downloading {IWSLT14_URL}")
    try:
        with urllib.request.urlopen(IWSLT14_URL, timeout=120) as response, open(path + ".part", "wb") as f:
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"could not download {IWSLT14_URL}: {exc} (use --raw-dir with a local copy)") from exc
    os.replace(path + ".part", path)
    return path


def find_raw_files(raw_dir=None, download=False, work_dir="."):
    """The folder holding ``train.tags.de-en.*`` and the test XML files: ``raw_dir/de-en/``,
    ``raw_dir`` itself, or the archive (``raw_dir/de-en.tgz`` or downloaded) extracted
    into ``work_dir/orig``."""
    check_iwslt14_source(raw_dir, download)
    orig = os.path.join(work_dir, "orig")
    if download:  # a finished download (renamed from .part) is reused by a re-run
        archive = os.path.join(orig, ARCHIVE)
        folder = _extract(archive if os.path.isfile(archive) else _download(orig), orig)
    else:
        for folder in (os.path.join(raw_dir, LANG_PAIR), raw_dir):
            if os.path.isdir(folder) and _has_files(folder):
                return folder
        archive = os.path.join(raw_dir, ARCHIVE)
        if not os.path.isfile(archive):
            folder = os.path.join(raw_dir, LANG_PAIR)
            folder = folder if os.path.isdir(folder) else raw_dir
            raise DataError(f"missing IWSLT'14 file {os.path.join(folder, _missing(folder)[0])} "
                            f"(check --raw-dir {raw_dir})")
        folder = _extract(archive, orig)
    if not _has_files(folder):
        raise DataError(f"{ARCHIVE} lacks {LANG_PAIR}/{_missing(folder)[0]}")
    return folder


# --------------------------------------------------------------------------------------
# The script's text steps
# --------------------------------------------------------------------------------------

def read_raw_lines(path):
    """The lines of ``path`` as they are (only ``\\n`` ends a line; invalid UTF-8 replaced)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8", errors="replace") for line in lines]


def strip_train_tags(lines):
    """``grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>'`` then the ``<title>`` and
    ``<description>`` tags removed: (lines, number dropped)."""
    kept = [line for line in lines if not any(tag in line for tag in DROPPED_TAGS)]
    for tag in REMOVED_TAGS:
        kept = [line.replace(tag, "") for line in kept]
    return kept, len(lines) - len(kept)


_SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def seg_lines(lines):
    """``grep '<seg id' | sed -e 's/<seg id="[0-9]*">\\s*//g' -e 's/\\s*<\\/seg>\\s*//g' -e "s/’/'/g"``."""
    out = []
    for line in lines:
        if "<seg id" in line:
            out.append(_SEG_CLOSE.sub("", _SEG_OPEN.sub("", line)).replace("\u2019", "'"))
    return out


_TOKENIZER = None
_FINAL_DOT = re.compile(r"^(\S+)\.$")


def _moses_tokenizer(lang):
    """sacremoses' ``MosesTokenizer`` with the rule ``tokenizer.perl`` has had since Moses
    commit 9fc964da (2018-11, "split final dots unconditionally"), which sacremoses 0.2.0
    lacks: the last word of a line loses its final dot even when it is a nonbreaking prefix
    (``im Jahr 2010.`` -> ``im Jahr 2010 .``). fairseq's script clones Moses' current code."""
    from sacremoses import MosesTokenizer

    class Tokenizer(MosesTokenizer):
        def handles_nonbreaking_prefixes(self, text):
            tokens = super().handles_nonbreaking_prefixes(text).split(" ")
            match = _FINAL_DOT.match(tokens[-1]) if tokens else None
            if match:
                tokens[-1] = match.group(1) + " ."
            return " ".join(tokens)

    return Tokenizer(lang=lang)


def _init_tokenizer(lang):
    global _TOKENIZER
    _TOKENIZER = _moses_tokenizer(lang)


def _tokenize_line(line):
    return _TOKENIZER.tokenize(line, return_str=True, escape=True)


def tokenize(lines, lang, workers=1):
    """``tokenizer.perl -l <lang>`` (``sacremoses``; ``workers`` processes, as ``-threads``)."""
    if workers <= 1 or len(lines) < 1000:
        _init_tokenizer(lang)
        return [_tokenize_line(line) for line in lines]
    with multiprocessing.get_context("fork").Pool(workers, _init_tokenizer, (lang,)) as pool:
        return pool.map(_tokenize_line, lines, chunksize=2000)


def lowercase(lines):
    """``lowercase.perl`` (Perl's ``lc``): each character's Unicode lowercase, without
    context. Python's ``str.lower`` adds one rule Perl's ``lc`` lacks, Unicode's Final_Sigma:
    a capital sigma that ends a word becomes ``ς``, where ``lc`` gives ``σ`` as everywhere
    (``ΟΔΟΣ`` -> ``οδοσ``). Mapping ``Σ`` to ``σ`` first leaves ``str.lower`` nothing
    conditional; everything else (full mappings such as ``İ`` -> ``i̇``) is the same in both."""
    return [line.replace("\u03a3", "\u03c3").lower() for line in lines]


def _normalize(line, factored):
    if not factored:
        line = line.replace("|", "")
    return re.sub(r"\s+", " ", line).strip(" ")


def clean_corpus(src_lines, tgt_lines, min_len=MIN_LEN, max_len=MAX_LEN, ratio=MAX_RATIO,
                 max_word_length=MAX_WORD_LENGTH):
    """Moses ``clean-corpus-n.perl -ratio <ratio> corpus src tgt out <min_len> <max_len>``.

    Per pair: ``|`` removed unless the first pair has one (factored text), whitespace
    squeezed and trimmed; dropped if a side is empty, has more than ``max_len`` or fewer
    than ``min_len`` words, one side has more than ``ratio`` times the other's words, or a
    word is longer than ``max_word_length`` characters. Returns (pairs, report).
    """
    if len(src_lines) != len(tgt_lines):
        raise DataError(f"the tokenized training sides differ in length ({len(src_lines)} vs "
                        f"{len(tgt_lines)} lines): the train.tags files are not aligned")
    factored = bool(src_lines) and ("|" in src_lines[0] or "|" in tgt_lines[0])
    long_word = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    dropped = {"empty": 0, "length": 0, "ratio": 0, "word_length": 0}
    pairs = []
    for src, tgt in zip(src_lines, tgt_lines):
        src, tgt = _normalize(src, factored), _normalize(tgt, factored)
        if not src or not tgt:
            dropped["empty"] += 1
            continue
        ns, nt = len(src.split(" ")), len(tgt.split(" "))
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            dropped["length"] += 1
        elif nt / ns > ratio or ns / nt > ratio:
            dropped["ratio"] += 1
        elif long_word.search(src) or long_word.search(tgt):
            dropped["word_length"] += 1
        else:
            if factored and (re.search(r"[ |]\|", src) or re.search(r"[ |]\|", tgt)):
                raise DataError(f"blank factor in the training text: {src!r} / {tgt!r}")
            pairs.append((src, tgt))
    return pairs, {"input": len(src_lines), "output": len(pairs), "dropped": dropped}


def split_valid(lines, every=VALID_EVERY):
    """``awk 'NR%23 == 0'`` (valid) and ``awk 'NR%23 != 0'`` (train): (train, valid)."""
    train = [line for i, line in enumerate(lines, 1) if i % every]
    valid = [line for i, line in enumerate(lines, 1) if not i % every]
    return train, valid


# --------------------------------------------------------------------------------------
# subword-nmt BPE
# --------------------------------------------------------------------------------------

def learn_bpe(inputs, codes_path, merges):
    """``learn_bpe.py -s <merges> < cat(inputs) > codes`` (subword-nmt's defaults otherwise)."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    text = []
    for path in inputs:
        with open(path, encoding="utf-8") as f:
            text.extend(f)
    with open(codes_path, "w", encoding="utf-8") as out:
        _learn(text, out, merges)
    return codes_path


def apply_bpe(codes_path, in_path, out_path):
    """``apply_bpe.py -c codes < in > out``."""
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as codes:
        bpe = BPE(codes)
    with open(in_path, encoding="utf-8") as f, open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for line in f:
            out.write(bpe.process_line(line))


# --------------------------------------------------------------------------------------
# The whole recipe
# --------------------------------------------------------------------------------------

def _write(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def _tokens(path):
    with open(path, encoding="utf-8") as f:
        return sum(len(line.split()) for line in f)


def check_settings(bpe_merges, workers):
    if bpe_merges < 1:
        raise DataError(f"--bpe-merges must be positive, not {bpe_merges}")
    if workers < 1:
        raise DataError(f"--workers must be at least 1, not {workers}")


def prepare(dest_dir, settings, raw_dir=None, download=False, work_dir=None, bpe_merges=BPE_MERGES, workers=1):
    """Run the recipe; ``dest_dir`` gets the binaries (``dict.{de,en}.txt``,
    ``{train,valid,test}.de-en.{de,en}.{bin,idx}``), the BPE ``code`` and ``prepare.json``
    (``settings`` plus what the comparison harness reads); intermediate text goes to
    ``work_dir`` (default ``dest_dir/work``): ``orig/`` (extracted archive), ``tok/``
    (tokenized, cleaned, lowercased splits and ``test.raw.*``) and ``bpe/`` (fairseq's
    ``iwslt14.tokenized.de-en`` text folder). Returns the summary."""
    check_settings(bpe_merges, workers)
    check_iwslt14_source(raw_dir, download)
    os.makedirs(dest_dir, exist_ok=True)
    if os.path.exists(os.path.join(dest_dir, "prepare.json")):
        os.remove(os.path.join(dest_dir, "prepare.json"))  # marks dest_dir unfinished until the end
    work_dir = work_dir or os.path.join(dest_dir, "work")
    tok_dir, bpe_dir = os.path.join(work_dir, "tok"), os.path.join(work_dir, "bpe")
    for d in (tok_dir, bpe_dir):
        os.makedirs(d, exist_ok=True)
    folder = find_raw_files(raw_dir, download, work_dir)
    langs = (SRC, TGT)

    log(f"[1/5] train: tag lines, Moses tokenization, clean-corpus (1-{MAX_LEN} words, ratio {MAX_RATIO}), "
        f"lowercase, every {VALID_EVERY}th line to valid")
    tokenized, tag_lines = {}, {}
    for lang in langs:
        lines, tag_lines[lang] = strip_train_tags(read_raw_lines(os.path.join(folder, train_file(lang))))
        tokenized[lang] = tokenize(lines, lang, workers)
    pairs, clean_report = clean_corpus(tokenized[SRC], tokenized[TGT])
    for i, lang in enumerate(langs):
        train, valid = split_valid(lowercase([p[i] for p in pairs]))
        _write(os.path.join(tok_dir, f"train.{lang}"), train)
        _write(os.path.join(tok_dir, f"valid.{lang}"), valid)

    log(f"[2/5] test: <seg> lines of {', '.join(TEST_SETS)}")
    test_counts = {}
    for lang in langs:
        raw, tok = [], []
        for name in TEST_SETS:
            segs = seg_lines(read_raw_lines(os.path.join(folder, test_file(name, lang))))
            test_counts.setdefault(name, {})[lang] = len(segs)
            raw += segs
            tok += lowercase(tokenize(segs, lang, workers))
        _write(os.path.join(tok_dir, f"test.raw.{lang}"), [" ".join(s.split()) for s in raw])
        _write(os.path.join(tok_dir, f"test.{lang}"), tok)
    for name, counts in test_counts.items():
        if counts[SRC] != counts[TGT]:
            raise DataError(f"{test_file(name, SRC)} has {counts[SRC]} <seg> lines but "
                            f"{test_file(name, TGT)} has {counts[TGT]}: the files are not aligned")

    log(f"[3/5] subword-nmt: learn_bpe -s {bpe_merges} on train.{SRC} + train.{TGT}")
    codes = learn_bpe([os.path.join(tok_dir, f"train.{lang}") for lang in langs],
                      os.path.join(bpe_dir, "code"), bpe_merges)
    log("[4/5] apply_bpe to every split")
    for split in SPLITS:
        for lang in langs:
            apply_bpe(codes, os.path.join(tok_dir, f"{split}.{lang}"), os.path.join(bpe_dir, f"{split}.{lang}"))

    log(f"[5/5] fairseq-preprocess -> {dest_dir}")
    fairseq_preprocess("--source-lang", SRC, "--target-lang", TGT, "--destdir", dest_dir, "--workers", workers,
                       *[arg for split, flag in zip(SPLITS, ("--trainpref", "--validpref", "--testpref"))
                         for arg in (flag, os.path.join(bpe_dir, split))])
    shutil.copyfile(codes, os.path.join(dest_dir, "code"))
    summary = {
        "settings": settings,
        "src": SRC,
        "tgt": TGT,
        "bpe": "subword_nmt",  # what fairseq-generate --remove-bpe takes ("@@ ")
        "bleu": "tokenized",
        "joined_dictionary": False,
        # raw <seg> text (cased, untokenized): the references of the sacreBLEU beside the headline
        "test_files": {key: os.path.abspath(os.path.join(tok_dir, f"test.raw.{lang}"))
                       for lang, key in ((SRC, "src"), (TGT, "tgt"))},
        "tokenized_test_files": {key: os.path.abspath(os.path.join(tok_dir, f"test.{lang}"))
                                 for lang, key in ((SRC, "src"), (TGT, "tgt"))},
        "length_ratio": round(_tokens(os.path.join(bpe_dir, f"train.{TGT}"))
                              / max(1, _tokens(os.path.join(bpe_dir, f"train.{SRC}"))), 4),
        "counts": {split: count_lines(os.path.join(tok_dir, f"{split}.{SRC}")) for split in SPLITS},
        "report": {"tag_lines_dropped": tag_lines, "clean": clean_report, "test_sets": test_counts},
        "dictionary_size": dictionary_size(os.path.join(dest_dir, f"dict.{TGT}.txt")),  # the target's, as elsewhere
        "dictionary_sizes": {lang: dictionary_size(os.path.join(dest_dir, f"dict.{lang}.txt")) for lang in langs},
        "dest_dir": os.path.abspath(dest_dir),
        "raw_dir": os.path.abspath(tok_dir),
        "bpe_dir": os.path.abspath(bpe_dir),
        "bpe_codes": os.path.abspath(os.path.join(dest_dir, "code")),
    }
    with open(os.path.join(dest_dir, "prepare.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    print(f"IWSLT'14 {SRC}->{TGT}: {summary['counts']} sentences in {dest_dir}", file=sys.stderr)
    return summary
