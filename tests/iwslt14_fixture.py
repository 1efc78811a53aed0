"""A tiny IWSLT'14 De-En archive in the original format (``de-en.tgz`` holding ``de-en/``
with ``train.tags.de-en.{de,en}`` and ``IWSLT14.*.de-en.{de,en}.xml``), with what
fairseq's ``prepare-iwslt14.sh`` makes of it written out by hand.

Every expected line is spelled here, not computed by the code under test: tokenized and
lowercased as ``tokenizer.perl -l de|en | lowercase.perl`` does (``&apos;`` and ``&quot;``
escapes, punctuation split off), and the pairs ``clean-corpus-n.perl -ratio 1.5 ... 1 175``
drops marked as such. When written, fairseq's script itself (verbatim but for paths, with
Moses' Perl scripts at commit 34452895f) made byte-identical BPE codes and splits of it.
"""

import io
import os
import tarfile

TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012")


def _talk_lines(talk):
    """(de raw, en raw, de expected, en expected, kept) for the lines of one talk, header included."""
    rows = [
        # the header: url, keywords and talkid lines are dropped; title and description lose their tags
        (f"<url>http://www.ted.com/talks/lang/de/talk_{talk}.html</url>",
         f"<url>http://www.ted.com/talks/talk_{talk}.html</url>", None, None, "tag"),
        ("<keywords>talks, Haus, Stadt</keywords>", "<keywords>talks, house, city</keywords>", None, None, "tag"),
        (f"<talkid>{talk}</talkid>", f"<talkid>{talk}</talkid>", None, None, "tag"),
        (f"<title>Anna: Haus {talk}</title>", f"<title>Anna: House {talk}</title>",
         f"anna : haus {talk}", f"anna : house {talk}", "kept"),
        (f"<description>TED Talk Subtitles and Transcript: Haus {talk}.</description>",
         f"<description>TED Talk Subtitles and Transcript: House {talk}.</description>",
         # a line's last word loses its dot even where German keeps ordinals ("3.") together:
         # tokenizer.perl since Moses 9fc964da (2018), which sacremoses alone does not do
         f"ted talk subtitles and transcript : haus {talk} .",
         f"ted talk subtitles and transcript : house {talk} .", "kept"),
    ]
    for i in range(1, 21):
        n = 100 * talk + i
        if i % 3 == 1:
            rows.append((f"Es ist Haus {n}, nicht wahr?", f"It's house {n}, isn't it?",
                         f"es ist haus {n} , nicht wahr ?", f"it &apos;s house {n} , isn &apos;t it ?", "kept"))
        elif i % 3 == 2:
            rows.append((f'Er sagte "Haus {n}".', f'He said "house {n}".',
                         f"er sagte &quot; haus {n} &quot; .", f"he said &quot; house {n} &quot; .", "kept"))
        else:
            rows.append((f"Das Haus Nummer {n} ist groß, sagt Anna.", f"The house number {n} is big, says Anna.",
                         f"das haus nummer {n} ist groß , sagt anna .",
                         f"the house number {n} is big , says anna .", "kept"))
    return rows


def _cleaning_rows():
    """Pairs on both sides of every clean-corpus-n.perl rule."""
    return [
        ("Nur Deutsch hier.", "   ", None, None, "empty"),
        ("Ja.", "Yes, of course.", None, None, "ratio"),               # 5 / 2 words > 1.5
        ("Danke.", "Thank you.", "danke .", "thank you .", "kept"),    # 3 / 2 words = 1.5
        (" ".join(["Wort"] * 176), " ".join(["word"] * 176), None, None, "length"),
        (" ".join(["Wort"] * 175), " ".join(["word"] * 175),
         " ".join(["wort"] * 175), " ".join(["word"] * 175), "kept"),
        ("Ein " + "x" * 1001 + " Wort", "A " + "x" * 1001 + " word", None, None, "word_length"),
        ("Ein " + "Y" * 1000 + " Wort", "A " + "Y" * 1000 + " word",
         "ein " + "y" * 1000 + " wort", "a " + "y" * 1000 + " word", "kept"),
        ("Ein   Haus\tsteht  hier.", "A  house stands\there.", "ein haus steht hier .", "a house stands here .",
         "kept"),
        # nonbreaking prefixes keep their dot inside a line, and lose it as the line's last word
        ("Am 3. Mai kam Anna mit Dr. Meier.", "He met Dr. Smith at 5 p.m.",
         "am 3. mai kam anna mit dr. meier .", "he met dr. smith at 5 p.m .", "kept"),
        ("Es war im Jahr 2010.", "It was in 2010.", "es war im jahr 2010 .", "it was in 2010 .", "kept"),
    ]


def _test_segs(name):
    """(de raw seg, en raw seg, de expected raw, en expected raw, de tokenized, en tokenized)."""
    short = name.split(".")[-1]
    return [
        (f' Satz eins aus {short}. ', f"It\u2019s sentence one of {short}.",
         f"Satz eins aus {short}.", f"It's sentence one of {short}.",
         f"satz eins aus {short} .", f"it &apos;s sentence one of {short} ."),
        (f"Zwei: {short}, Ende.", f"Two: {short}, end.",
         f"Zwei: {short}, Ende.", f"Two: {short}, end.",
         f"zwei : {short} , ende .", f"two : {short} , end ."),
    ]


def _xml(name, lang, segs):
    kind, attr = ("srcset", 'srclang="german"') if lang == "de" else ("refset", 'trglang="english"')
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<{kind} setid="{name}" {attr}>',
             '<doc docid="535" genre="lectures">', "<url>http://www.ted.com/talks/x.html</url>",
             "<description>TED Talk Subtitles and Transcript: a talk.</description>",
             "<keywords>talks</keywords>", "<talkid>535</talkid>", "<title>A talk</title>"]
    lines += [f'<seg id="{k}">{text}</seg>' for k, text in enumerate(segs, 1)]
    lines += ["</doc>", f"</{kind}>", "</mteval>"]
    return "\n".join(lines) + "\n"


def write_archive(folder, extracted=False):
    """Write ``folder/de-en.tgz`` (or, with ``extracted``, ``folder/de-en/``); return the
    expected output: ``train``/``valid``/``test`` ``{lang: lines}`` (tokenized, lowercased),
    ``test_raw`` ``{lang: lines}``, ``dropped`` (rule -> pairs) and ``tag_lines`` per side."""
    rows = []
    for talk in (1, 2, 3):
        rows += _talk_lines(talk)
        if talk == 2:
            rows += _cleaning_rows()
    files = {"train.tags.de-en.de": "\n".join(r[0] for r in rows) + "\n",
             "train.tags.de-en.en": "\n".join(r[1] for r in rows) + "\n"}
    kept = [(r[2], r[3]) for r in rows if r[4] == "kept"]
    dropped = {}
    for r in rows:
        if r[4] not in ("kept", "tag"):
            dropped[r[4]] = dropped.get(r[4], 0) + 1
    expected = {"train": {}, "valid": {}, "test": {}, "test_raw": {}, "dropped": dropped,
                "tag_lines": sum(r[4] == "tag" for r in rows), "kept": len(kept)}
    for i, lang in enumerate(("de", "en")):
        side = [pair[i] for pair in kept]
        expected["valid"][lang] = [line for n, line in enumerate(side, 1) if n % 23 == 0]
        expected["train"][lang] = [line for n, line in enumerate(side, 1) if n % 23 != 0]
    # the test sets, written in another order than the recipe's, plus one the recipe does not use
    for name in reversed(TEST_SETS + ("IWSLT14.TED.tst2013",)):
        segs = _test_segs(name)
        for i, lang in enumerate(("de", "en")):
            files[f"{name}.de-en.{lang}.xml"] = _xml(name, lang, [s[i] for s in segs])
    for i, lang in enumerate(("de", "en")):
        expected["test_raw"][lang] = [s[2 + i] for name in TEST_SETS for s in _test_segs(name)]
        expected["test"][lang] = [s[4 + i] for name in TEST_SETS for s in _test_segs(name)]
    os.makedirs(folder, exist_ok=True)
    if extracted:
        os.makedirs(os.path.join(folder, "de-en"), exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(folder, "de-en", name), "w", encoding="utf-8") as f:
                f.write(text)
    else:
        with tarfile.open(os.path.join(folder, "de-en.tgz"), "w:gz") as tar:
            for name, text in files.items():
                data = text.encode("utf-8")
                info = tarfile.TarInfo(f"de-en/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return expected
