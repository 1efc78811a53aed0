"""Parallel English->German corpora for the demo and for Multi30k, and their preparation.

Pipeline (``prepare``): raw text -> joint SentencePiece model -> ``*.spm.{en,de}`` piece
files -> ``fairseq-preprocess`` binaries in ``dest_dir`` (+ ``spm.model``, ``prepare.json``).

* ``make_synthetic_en_de``: a deterministic, grammar-generated En->De task (gender, case
  and adjective agreement, plurals, number words, conjugation, V2 and verb-final order)
  that a small model learns in a few CPU minutes and that needs no download.
* ``load_multi30k``: Multi30k task 1 (train / val / test_2016_flickr) from a local copy
  (plain or ``.gz``) or from the official GitHub repository.
"""

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

from .errors import DataError  # noqa: F401  (raised here; corpora.DataError for callers)

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"


# --------------------------------------------------------------------------------------
# Synthetic grammar: lexicon
# --------------------------------------------------------------------------------------

# English singular / plural, German singular / plural, gender (m, f, n), semantic class.
_NOUN_ROWS = """
man men Mann Männer m person | woman women Frau Frauen f person | child children Kind Kinder n person
girl girls Mädchen Mädchen n person | teacher teachers Lehrer Lehrer m person
doctor doctors Arzt Ärzte m person | friend friends Freund Freunde m person
mother mothers Mutter Mütter f person | father fathers Vater Väter m person
king kings König Könige m person | cook cooks Koch Köche m person
dog dogs Hund Hunde m animal | cat cats Katze Katzen f animal | horse horses Pferd Pferde n animal
bird birds Vogel Vögel m animal | mouse mice Maus Mäuse f animal
book books Buch Bücher n readable | letter letters Brief Briefe m readable
newspaper newspapers Zeitung Zeitungen f readable | picture pictures Bild Bilder n thing
car cars Auto Autos n thing | ball balls Ball Bälle m thing | key keys Schlüssel Schlüssel m thing
bottle bottles Flasche Flaschen f thing | cup cups Tasse Tassen f thing | lamp lamps Lampe Lampen f thing
boat boats Boot Boote n thing | flower flowers Blume Blumen f thing | hat hats Hut Hüte m thing
bag bags Tasche Taschen f thing
apple apples Apfel Äpfel m food | bread breads Brot Brote n food | cake cakes Kuchen Kuchen m food
banana bananas Banane Bananen f food | egg eggs Ei Eier n food
garden gardens Garten Gärten m place | kitchen kitchens Küche Küchen f place | house houses Haus Häuser n place
city cities Stadt Städte f place | park parks Park Parks m place | school schools Schule Schulen f place
village villages Dorf Dörfer n place | room rooms Zimmer Zimmer n place | forest forests Wald Wälder m place
table tables Tisch Tische m surface | chair chairs Stuhl Stühle m surface | bed beds Bett Betten n surface
bridge bridges Brücke Brücken f surface
"""

# English, German stem, which nouns it may describe (any / animate / inanimate).
_ADJECTIVE_ROWS = """
big groß any | small klein any | old alt any | beautiful schön any | good gut any
black schwarz any | white weiß any | young jung animate | tired müde animate
happy glücklich animate | fast schnell animate | red rot inanimate | green grün inanimate
blue blau inanimate | new neu inanimate | heavy schwer inanimate
"""

# English base / 3sg / past; German present 1sg 2sg 3sg 1pl 3pl, participle, auxiliary;
# subject class, object frame (none, acc:<classes>, dat:<classes>, dat+acc:<classes>).
_VERB_ROWS = """
see sees saw | sehe siehst sieht sehen sehen gesehen haben | animate acc:animate,thing,readable,food,place,surface
find finds found | finde findest findet finden finden gefunden haben | animate acc:animate,thing,readable,food
look_for looks_for looked_for | suche suchst sucht suchen suchen gesucht haben | animate acc:animate,thing,readable,food
like likes liked | mag magst mag mögen mögen gemocht haben | animate acc:animate,thing,readable,food
buy buys bought | kaufe kaufst kauft kaufen kaufen gekauft haben | person acc:thing,readable,food
carry carries carried | trage trägst trägt tragen tragen getragen haben | person acc:thing,readable,food
read reads read | lese liest liest lesen lesen gelesen haben | person acc:readable
paint paints painted | male malst malt malen malen gemalt haben | person acc:animate,thing,food,place
visit visits visited | besuche besuchst besucht besuchen besuchen besucht haben | person acc:person,place
eat eats ate | esse isst isst essen essen gegessen haben | animate acc:food
help helps helped | helfe hilfst hilft helfen helfen geholfen haben | person dat:person
give gives gave | gebe gibst gibt geben geben gegeben haben | person dat+acc:thing,readable,food
show shows showed | zeige zeigst zeigt zeigen zeigen gezeigt haben | person dat+acc:animate,thing,readable
sleep sleeps slept | schlafe schläfst schläft schlafen schlafen geschlafen haben | animate none
run runs ran | laufe läufst läuft laufen laufen gelaufen sein | animate none
sing sings sang | singe singst singt singen singen gesungen haben | animate none
wait waits waited | warte wartest wartet warten warten gewartet haben | animate none
play plays played | spiele spielst spielt spielen spielen gespielt haben | animate none
work works worked | arbeite arbeitest arbeitet arbeiten arbeiten gearbeitet haben | person none
sit sits sat | sitze sitzt sitzt sitzen sitzen gesessen haben | animate none
laugh laughs laughed | lache lachst lacht lachen lachen gelacht haben | person none
swim swims swam | schwimme schwimmst schwimmt schwimmen schwimmen geschwommen sein | animate none
"""

# Verbs that take a "that"-clause ("The woman says that ..." -> "Die Frau sagt, dass ...").
_SAY_ROWS = """
say says said | sage sagst sagt sagen sagen gesagt haben
think thinks thought | denke denkst denkt denken denken gedacht haben
know knows knew | weiß weißt weiß wissen wissen gewusst haben
"""

_AUX = {"haben": "habe hast hat haben haben".split(), "sein": "bin bist ist sind sind".split()}
_NUMBERS = list(zip(
    "two three four five six seven eight nine ten eleven twelve".split(),
    "zwei drei vier fünf sechs sieben acht neun zehn elf zwölf".split(),
))
# Subject pronouns: English, German, person index into the German forms (1sg 2sg 3sg 1pl 3pl).
_PRONOUNS = [("I", "ich", 0), ("you", "du", 1), ("he", "er", 2), ("she", "sie", 2),
             ("we", "wir", 3), ("they", "sie", 4)]
_OBJECT_PRONOUNS = {  # subject pronoun -> its object form: (English, German acc, German dat)
    "I": ("me", "mich", "mir"), "you": ("you", "dich", "dir"), "he": ("him", "ihn", "ihm"),
    "she": ("her", "sie", "ihr"), "we": ("us", "uns", "uns"), "they": ("them", "sie", "ihnen"),
}
# English, German, the noun classes they combine with (always a singular dative NP).
_PREPOSITIONS = [("in", "in", "place"), ("next to", "neben", "place surface animate thing"),
                 ("behind", "hinter", "place surface animate thing"),
                 ("in front of", "vor", "place surface animate thing"),
                 ("on", "auf", "surface"), ("under", "unter", "surface"), ("with", "mit", "animate")]
_ADVERBS = {"present": [("today", "heute"), ("now", "jetzt"), ("often", "oft")],
            "past": [("yesterday", "gestern")]}
_CONJUNCTIONS = [("because", "weil", False), ("although", "obwohl", True)]  # (.., English comma?)

# German article and adjective endings by case and gender/number (m, f, n, pl).
_DEFINITE = {"nom": "der die das die", "acc": "den die das die", "dat": "dem der dem den"}
_EIN_ENDINGS = {"nom": "- e - e", "acc": "en e - e", "dat": "em er em en"}
_WEAK_ADJ = {"nom": "e e e en", "acc": "en e e en", "dat": "en en en en"}
_MIXED_ADJ = {"nom": "er e es en", "acc": "en e es en", "dat": "en en en en"}
_STRONG_PLURAL_ADJ = {"nom": "e", "acc": "e", "dat": "en"}
_SLOT = {"m": 0, "f": 1, "n": 2, "pl": 3}


def _table(rows):
    return {case: value.split() for case, value in rows.items()}


_DEFINITE, _EIN_ENDINGS, _WEAK_ADJ, _MIXED_ADJ = map(
    _table, (_DEFINITE, _EIN_ENDINGS, _WEAK_ADJ, _MIXED_ADJ))


def _rows(text):
    return [r.strip() for line in text.strip().splitlines() for r in line.split("|") if r.strip()]


def _parse_nouns():
    nouns = []
    for row in _rows(_NOUN_ROWS):
        en, en_pl, de, de_pl, gender, cls = row.split()
        nouns.append(dict(en=en, en_pl=en_pl, de=de, de_pl=de_pl, gender=gender, cls=cls))
    return nouns


def _parse_verbs(text, with_frame):
    verbs, lines = [], [line for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        parts = [p.split() for p in line.split("|")]
        en, de = parts[0], parts[1]
        verb = dict(en=[w.replace("_", " ") for w in en], de=de[:5], part=de[5], aux=de[6])
        if with_frame:
            verb["subj"], frame = parts[2]
            kind, _, classes = frame.partition(":")
            verb["frame"], verb["obj"] = kind, classes.split(",") if classes else []
        verbs.append(verb)
    return verbs


NOUNS = _parse_nouns()
ADJECTIVES = [dict(zip(("en", "de", "applies"), r.split())) for r in _rows(_ADJECTIVE_ROWS)]
VERBS = _parse_verbs(_VERB_ROWS, with_frame=True)
SAY_VERBS = _parse_verbs(_SAY_ROWS, with_frame=False)
_ANIMATE = {"person", "animal"}


def _classes(cls):
    """Semantic classes a noun class belongs to (``animate`` covers people and animals)."""
    return {cls, "animate"} if cls in _ANIMATE else {cls, "thing"} if cls == "readable" else {cls}


def _nouns_of(classes):
    wanted = set(classes)
    return [n for n in NOUNS if _classes(n["cls"]) & wanted]


# --------------------------------------------------------------------------------------
# Synthetic grammar: phrases
# --------------------------------------------------------------------------------------

def _join_ending(stem, ending):
    if ending in ("", "-"):
        return stem
    return stem + (ending[1:] if stem.endswith("e") and ending.startswith("e") else ending)


def _dative_plural(form):
    return form if form.endswith(("n", "s")) else form + "n"


def _english_article(next_word):
    return "an" if next_word[0].lower() in "aeiou" else "a"


def noun_phrase(rng, classes, case, allow_plural=True):
    """An (English, German, person index) noun phrase of one of ``classes`` in ``case``."""
    noun = rng.choice(_nouns_of(classes))
    adjs = [a for a in ADJECTIVES if a["applies"] == "any"
            or (a["applies"] == "animate") == (noun["cls"] in _ANIMATE)]
    adj = rng.choice(adjs) if rng.random() < 0.35 else None
    plural = allow_plural and rng.random() < 0.3
    det = rng.choice(["the", "the", "number", "my"] if plural else ["the", "the", "a", "my", "your"])
    slot = _SLOT["pl" if plural else noun["gender"]]
    en_noun, de_noun = (noun["en_pl"], noun["de_pl"]) if plural else (noun["en"], noun["de"])
    if plural and case == "dat":
        de_noun = _dative_plural(de_noun)
    if det == "the":
        en_det, de_det, adj_end = "the", _DEFINITE[case][slot], _WEAK_ADJ[case][slot]
    elif det == "number":
        en_det, de_det = rng.choice(_NUMBERS)
        adj_end = _STRONG_PLURAL_ADJ[case]
    else:
        de_stem = {"a": "ein", "my": "mein", "your": "dein"}[det]
        de_det = _join_ending(de_stem, _EIN_ENDINGS[case][slot])
        en_det = det if det != "a" else _english_article(adj["en"] if adj else en_noun)
        adj_end = _MIXED_ADJ[case][slot]
    en = [en_det] + ([adj["en"]] if adj else []) + [en_noun]
    de = [de_det] + ([_join_ending(adj["de"], adj_end)] if adj else []) + [de_noun]
    return en, de, (4 if plural else 2)


def prepositional_phrase(rng):
    """A locative/comitative PP with a dative singular NP ("in dem" contracts to "im")."""
    en_prep, de_prep, classes = rng.choice(_PREPOSITIONS)
    en, de, _ = noun_phrase(rng, classes.split(), "dat", allow_plural=False)
    if de_prep == "in" and de[0] == "dem":
        return [en_prep] + en, ["im"] + de[1:]
    return [en_prep] + en, [de_prep] + de


def _subject(rng, subj_class):
    if rng.random() < 0.3:  # people and animate subjects may be pronouns
        en, de, person = rng.choice(_PRONOUNS)
        return [en], [de], person
    return noun_phrase(rng, [subj_class], "nom")


def _object(rng, frame, classes, subj_en):
    """Objects as (English words, German words in German order)."""
    if frame == "none":
        return [], []
    if frame == "dat+acc":
        ind_en, ind_de = _pronoun_or_np(rng, "dat", subj_en)
        obj_en, obj_de, _ = noun_phrase(rng, classes, "acc")
        return ind_en + obj_en, ind_de + obj_de
    return _pronoun_or_np(rng, frame, subj_en, classes)


def _pronoun_or_np(rng, case, subj_en, classes=("person",)):
    if {"person", "animate"} & set(classes) and rng.random() < 0.2:
        key = rng.choice([k for k in _OBJECT_PRONOUNS if k != subj_en[0]])
        en, acc, dat = _OBJECT_PRONOUNS[key]
        return [en], [acc if case == "acc" else dat]
    en, de, _ = noun_phrase(rng, list(classes), case)
    return en, de


class Clause:
    """One clause, realized as English SVO and as German V2, verb-first or verb-final."""

    def __init__(self, rng, tense, verbs=VERBS, with_pp=None):
        self.verb, self.tense = rng.choice(verbs), tense
        self.subj_en, self.subj_de, self.person = _subject(rng, self.verb.get("subj", "person"))
        self.obj_en, self.obj_de = _object(rng, self.verb.get("frame", "none"), self.verb.get("obj"), self.subj_en)
        with_pp = rng.random() < 0.35 if with_pp is None else with_pp
        self.pp_en, self.pp_de = prepositional_phrase(rng) if with_pp else ([], [])

    def _english_verb(self):
        base, third, past = self.verb["en"]
        if self.tense == "past":
            return past
        return third if self.person == 2 else base

    def _german_verbs(self):
        """(finite verb, non-finite rest) for the German clause."""
        if self.tense == "past":
            return _AUX[self.verb["aux"]][self.person], [self.verb["part"]]
        return self.verb["de"][self.person], []

    def english(self, question=False):
        rest = self.obj_en + self.pp_en
        if not question:
            return self.subj_en + [self._english_verb()] + rest
        do = "did" if self.tense == "past" else "does" if self.person == 2 else "do"
        return [do] + self.subj_en + [self.verb["en"][0]] + rest

    def german(self, order="v2", front=None):
        """``order``: v2 (main clause, optional fronted element), v1 (questions, and main
        clauses after a fronted subordinate clause) or final (subordinate clauses)."""
        finite, rest = self._german_verbs()
        middle = self.obj_de + self.pp_de
        if order == "final":
            return self.subj_de + middle + rest + [finite]
        if order == "v1":
            return [finite] + self.subj_de + middle + rest
        if front:
            return front + [finite] + self.subj_de + middle + rest
        return self.subj_de + [finite] + middle + rest


def _capitalize(words):
    text = " ".join(words)
    return text[0].upper() + text[1:]


def _finish(en, de, mark="."):
    en_text = _capitalize(en).replace(" ,", ",") + mark
    de_text = _capitalize(de).replace(" ,", ",") + mark
    return en_text, de_text


def synthetic_pair(rng):
    """One random (English, German) sentence pair from the grammar."""
    tense = rng.choice(["present", "present", "past"])
    kind = rng.random()
    if kind < 0.45:
        clause = Clause(rng, tense)
        if rng.random() < 0.2:
            adv_en, adv_de = rng.choice(_ADVERBS[tense])
            return _finish([adv_en] + clause.english(), clause.german(front=[adv_de]))
        return _finish(clause.english(), clause.german())
    if kind < 0.57:
        clause = Clause(rng, tense)
        return _finish(clause.english(question=True), clause.german("v1"), "?")
    if kind < 0.85:
        main, sub = Clause(rng, tense, with_pp=False), Clause(rng, rng.choice(["present", "past"]))
        conj_en, conj_de, en_comma = rng.choice(_CONJUNCTIONS)
        if rng.random() < 0.2:  # subordinate clause first: the main clause inverts (V1 after it)
            en = [conj_en] + sub.english() + [","] + main.english()
            return _finish(en, [conj_de] + sub.german("final") + [","] + main.german("v1"))
        en = main.english() + ([","] if en_comma else []) + [conj_en] + sub.english()
        return _finish(en, main.german() + [",", conj_de] + sub.german("final"))
    matrix = Clause(rng, tense, verbs=SAY_VERBS, with_pp=False)
    sub = Clause(rng, rng.choice(["present", "past"]))
    en = matrix.english() + ["that"] + sub.english()
    return _finish(en, matrix.german() + [",", "dass"] + sub.german("final"))


# --------------------------------------------------------------------------------------
# Corpus files
# --------------------------------------------------------------------------------------

def _write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def read_lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_split(out_dir, split, pairs):
    """Write ``split.en`` / ``split.de`` from (en, de) pairs."""
    os.makedirs(out_dir, exist_ok=True)
    for i, lang in enumerate(LANGS):
        _write_lines(os.path.join(out_dir, f"{split}.{lang}"), [p[i] for p in pairs])


def make_synthetic_en_de(out_dir, n_train=20000, n_valid=500, n_test=500, seed=1):
    """Write a reproducible synthetic En->De corpus (no sentence in two splits); return counts."""
    rng, seen, pairs = random.Random(seed), set(), []
    total = n_train + n_valid + n_test
    for _ in range(total * 50):
        if len(pairs) == total:
            break
        en, de = synthetic_pair(rng)
        if en not in seen:
            seen.add(en)
            pairs.append((en, de))
    else:
        if len(pairs) < total:
            raise DataError(f"the synthetic grammar produced only {len(pairs)} distinct sentences")
    counts, start = {}, 0
    for split, n in zip(SPLITS, (n_train, n_valid, n_test)):
        write_split(out_dir, split, pairs[start:start + n])
        counts[split], start = n, start + n
    return counts


# --------------------------------------------------------------------------------------
# Multi30k
# --------------------------------------------------------------------------------------

def _find_raw_file(raw_dir, name, lang):
    for candidate in (f"{name}.{lang}", f"{name}.{lang}.gz"):
        path = os.path.join(raw_dir, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"missing Multi30k file {os.path.join(raw_dir, name + '.' + lang)}[.gz] "
                    f"(check --raw-dir {raw_dir})")


def _download(name, lang, dest_dir):
    url = MULTI30K_URL.format(name=name, lang=lang)
    path = os.path.join(dest_dir, f"{name}.{lang}.gz")
    print(f"downloading {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(path + ".part", "wb") as f:
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"could not download {url}: {exc} (use --raw-dir with a local copy)") from exc
    os.replace(path + ".part", path)
    return path


def read_text_lines(path):
    """Lines of a plain or gzipped file: (lines, number of lines with invalid UTF-8).

    Only ``\\n`` ends a line; whitespace inside a line (``\\r``, tabs, ...) is collapsed
    to single spaces so that every downstream tool sees the same line count.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines, bad = [], 0
    for raw in raw_lines:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text, bad = raw.decode("utf-8", errors="replace"), bad + 1
        lines.append(" ".join(text.lstrip("\ufeff").split()))
    return lines, bad


def read_parallel(src_path, tgt_path):
    """Aligned non-empty (src, tgt) pairs and a report of what was fixed or dropped."""
    src, src_bad = read_text_lines(src_path)
    tgt, tgt_bad = read_text_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{tgt_path} has {len(tgt)} lines but {src_path} has {len(src)}: "
                        "the files are not aligned")
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    report = {"lines": len(src), "kept": len(pairs), "dropped_empty": len(src) - len(pairs),
              "non_utf8_lines": {src_path: src_bad, tgt_path: tgt_bad}}
    return pairs, report


def check_multi30k_source(raw_dir=None, download=False):
    """Fail early (before anything is written) when there is nowhere to read Multi30k from."""
    if raw_dir is None and not download:
        raise DataError("Multi30k needs --raw-dir DIR (a local copy) or --download")
    if raw_dir is not None and not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir} is not a directory")
    if raw_dir is not None:
        for name in MULTI30K_FILES.values():
            for lang in LANGS:
                _find_raw_file(raw_dir, name, lang)


def load_multi30k(out_dir, raw_dir=None, download=False):
    """Write Multi30k task 1 as ``{train,valid,test}.{en,de}``; return a per-split report."""
    check_multi30k_source(raw_dir, download)
    os.makedirs(out_dir, exist_ok=True)
    report = {}
    for split, name in MULTI30K_FILES.items():
        if raw_dir is not None:
            paths = [_find_raw_file(raw_dir, name, lang) for lang in LANGS]
        else:
            paths = [_download(name, lang, out_dir) for lang in LANGS]
        pairs, report[split] = read_parallel(*paths)
        write_split(out_dir, split, pairs)
        for path, bad in report[split]["non_utf8_lines"].items():
            if bad:
                print(f"warning: {path}: {bad} lines had invalid UTF-8 (replaced with U+FFFD)",
                      file=sys.stderr)
        if report[split]["dropped_empty"]:
            print(f"warning: {split}: dropped {report[split]['dropped_empty']} pairs with an empty side",
                  file=sys.stderr)
    return report


# --------------------------------------------------------------------------------------
# SentencePiece and fairseq-preprocess
# --------------------------------------------------------------------------------------

def train_sentencepiece(raw_dir, out_prefix, vocab_size, model_type="bpe", max_sentences=0):
    """Train a joint SentencePiece model on ``train.en`` + ``train.de``; return the .model path."""
    import sentencepiece as spm

    inputs = [os.path.join(raw_dir, f"train.{lang}") for lang in LANGS]
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(inputs), model_prefix=out_prefix, vocab_size=vocab_size,
        model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=1, minloglevel=2,
    )
    return out_prefix + ".model"


def encode_files(model_path, raw_dir, out_dir, splits=SPLITS):
    """Write ``{split}.spm.{lang}`` piece files for every raw split; return their prefix map."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    os.makedirs(out_dir, exist_ok=True)
    for split in splits:
        for lang in LANGS:
            lines = read_lines(os.path.join(raw_dir, f"{split}.{lang}"))
            pieces = sp.encode(lines, out_type=str)
            _write_lines(os.path.join(out_dir, f"{split}.spm.{lang}"), [" ".join(p) for p in pieces])
    return {split: os.path.join(out_dir, f"{split}.spm") for split in splits}


def binarize(spm_dir, dest_dir, src="en", tgt="de", joined_dictionary=True, workers=1):
    """Run ``fairseq-preprocess`` (same interpreter) on ``{train,valid,test}.spm.*``."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", dest_dir, "--workers", str(workers)]
    for split, flag in zip(SPLITS, ("--trainpref", "--validpref", "--testpref")):
        cmd += [flag, os.path.join(spm_dir, f"{split}.spm")]
    if joined_dictionary:
        cmd.append("--joined-dictionary")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise DataError(f"fairseq-preprocess failed (exit {proc.returncode}):\n{tail}")
    return dest_dir


def _dict_size(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) + 4  # fairseq adds <s>, <pad>, </s>, <unk>


DEFAULT_VOCAB = {"synthetic": 1000, "multi30k": 8000}


def prepare_settings(corpus, vocab_size=None, seed=1, synthetic_sizes=None, model_type="bpe",
                     raw_dir=None, download=False):
    """The settings ``prepare`` records in ``prepare.json`` (used to detect stale data)."""
    if corpus not in DEFAULT_VOCAB:
        raise DataError(f"--corpus must be one of {sorted(DEFAULT_VOCAB)}, not {corpus!r}")
    settings = {"corpus": corpus, "vocab_size": vocab_size or DEFAULT_VOCAB[corpus], "model_type": model_type}
    if corpus == "synthetic":
        settings.update(seed=seed, sizes=dict(synthetic_sizes or {}))
    else:
        settings.update(raw_dir=os.path.abspath(raw_dir) if raw_dir else None, download=download)
    return settings


def prepare(corpus, dest_dir, raw_dir=None, download=False, vocab_size=None, work_dir=None,
            seed=1, synthetic_sizes=None, model_type="bpe"):
    """Build raw text, SentencePiece and fairseq binaries for ``corpus``; return the summary.

    Raw and piece files go to ``work_dir`` (default ``dest_dir/work``); ``dest_dir`` gets
    the binaries, ``spm.model`` and ``prepare.json``.
    """
    settings = prepare_settings(corpus, vocab_size, seed, synthetic_sizes, model_type, raw_dir, download)
    vocab_size = settings["vocab_size"]
    if vocab_size < 50:
        raise DataError(f"--vocab-size {vocab_size} is too small (use at least 50)")
    if corpus == "multi30k":
        check_multi30k_source(raw_dir, download)
    os.makedirs(dest_dir, exist_ok=True)
    if os.path.exists(os.path.join(dest_dir, "prepare.json")):
        os.remove(os.path.join(dest_dir, "prepare.json"))  # marks dest_dir unfinished until the end
    work_dir = work_dir or os.path.join(dest_dir, "work")
    text_dir, spm_dir = os.path.join(work_dir, "raw"), os.path.join(work_dir, "spm")
    _log(f"[1/4] writing raw {corpus} text to {text_dir}")
    if corpus == "synthetic":
        report = make_synthetic_en_de(text_dir, seed=seed, **settings["sizes"])
    else:
        report = load_multi30k(text_dir, raw_dir=raw_dir, download=download)
    _log(f"[2/4] training a joint SentencePiece {model_type} model (vocab {vocab_size})")
    model = train_sentencepiece(text_dir, os.path.join(spm_dir, "spm"), vocab_size, model_type)
    _log("[3/4] encoding splits into pieces")
    encode_files(model, text_dir, spm_dir)
    _log(f"[4/4] fairseq-preprocess -> {dest_dir}")
    binarize(spm_dir, dest_dir)
    shutil.copyfile(model, os.path.join(dest_dir, "spm.model"))
    summary = {
        "settings": settings,
        "counts": {split: _count_lines(os.path.join(text_dir, f"{split}.en")) for split in SPLITS},
        "report": report,
        "dictionary_size": _dict_size(os.path.join(dest_dir, "dict.de.txt")),
        "dest_dir": os.path.abspath(dest_dir),
        "raw_dir": os.path.abspath(text_dir),
        "spm_dir": os.path.abspath(spm_dir),
        "spm_model": os.path.abspath(os.path.join(dest_dir, "spm.model")),
    }
    with open(os.path.join(dest_dir, "prepare.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    return summary


def prepared_settings(dest_dir):
    """The ``settings`` recorded by a finished ``prepare`` in ``dest_dir``, or None."""
    try:
        with open(os.path.join(dest_dir, "prepare.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    needed = ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "test.en-de.de.bin", "spm.model")
    if not all(os.path.exists(os.path.join(dest_dir, n)) for n in needed):
        return None
    return summary.get("settings")


def _count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _log(message):
    print(message, file=sys.stderr, flush=True)
