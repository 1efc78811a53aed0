"""A deterministic, grammar-generated English->German corpus: the offline demo task.

Gender, case and adjective agreement, plurals, number words, conjugation, V2 and
verb-final order: a task a small model learns in a few CPU minutes, needing no download.
``make_synthetic_en_de`` writes ``{train,valid,test}.{en,de}``.
"""

import random

from realformer_nmt.errors import DataError

from .pipeline import SPLITS, write_split

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
