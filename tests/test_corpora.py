"""Corpus building and preparation: synthetic grammar, Multi30k loader, prepare pipeline."""

import gzip
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import MULTI30K, require_shared_data
from inprocess import run_in_process

from realformer_tools.data import corpora, multi30k, pipeline, synthetic_en_de

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _corpus(out_dir, seed, **sizes):
    sizes = dict(dict(n_train=400, n_valid=50, n_test=50), **sizes)
    counts = synthetic_en_de.make_synthetic_en_de(str(out_dir), seed=seed, **sizes)
    return counts, {f"{s}.{lang}": _lines(os.path.join(out_dir, f"{s}.{lang}"))
                    for s in pipeline.SPLITS for lang in pipeline.LANGS}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return _corpus(tmp_path_factory.mktemp("syn"), seed=1)


def test_synthetic_is_deterministic_per_seed(synthetic, tmp_path):
    _, again = _corpus(tmp_path / "again", seed=1)
    _, other = _corpus(tmp_path / "other", seed=2)
    assert again == synthetic[1]
    assert other["train.en"] != synthetic[1]["train.en"]


def test_synthetic_golden_first_pairs(synthetic):
    """Pins the generator: any change to the grammar or its random draws shows up here."""
    files = synthetic[1]
    assert list(zip(files["train.en"][:3], files["train.de"][:3])) == [
        ("Does she look for the apple?", "Sucht sie den Apfel?"),
        ("The fathers see my fast woman.", "Die Väter sehen meine schnelle Frau."),
        ("Yesterday the mother painted your newspaper.", "Gestern hat die Mutter deine Zeitung gemalt."),
    ]


def test_german_inflection_helpers():
    assert synthetic_en_de._join_ending("müde", "e") == "müde" and synthetic_en_de._join_ending("müde", "en") == "müden"
    assert synthetic_en_de._join_ending("groß", "er") == "großer" and synthetic_en_de._join_ending("ein", "-") == "ein"
    assert [synthetic_en_de._dative_plural(w) for w in ("Hunde", "Frauen", "Autos", "Kinder")] == [
        "Hunden", "Frauen", "Autos", "Kindern"]
    assert synthetic_en_de._english_article("old") == "an" and synthetic_en_de._english_article("young") == "a"


def test_synthetic_counts_align_and_splits_are_disjoint(synthetic):
    counts, files = synthetic
    assert counts == {"train": 400, "valid": 50, "test": 50}
    for split, n in counts.items():
        assert len(files[f"{split}.en"]) == len(files[f"{split}.de"]) == n
    train, test = set(files["train.en"]), set(files["test.en"])
    assert len(train) == 400 and not train & test and not set(files["valid.en"]) & (train | test)


def test_synthetic_sentences_are_cased_and_punctuated(synthetic):
    for line in synthetic[1]["train.en"] + synthetic[1]["train.de"]:
        assert line[0].isupper() and line[-1] in ".?" and "  " not in line


FINITE = {w for v in synthetic_en_de.VERBS + synthetic_en_de.SAY_VERBS for w in v["de"]} | {
    w for forms in synthetic_en_de._AUX.values() for w in forms}


def _pairs(n, seed=0):
    import random

    rng = random.Random(seed)
    return [synthetic_en_de.synthetic_pair(rng) for _ in range(n)]


def test_synthetic_german_verb_final_clauses():
    pairs = _pairs(3000)
    for conj in ("weil", "dass", "obwohl"):
        clauses = [de.split(f", {conj} ")[1] for _, de in pairs if f", {conj} " in de]
        assert len(clauses) > 50, conj
        for clause in clauses:  # "..., weil der Mann den Hund sieht." / "... gesehen hat."
            assert clause.rstrip(".?").split()[-1] in FINITE, clause
    # subordinate clause first: the main clause starts with its finite verb (V1 after the comma)
    fronted = [de for _, de in pairs if de.startswith("Weil ")]
    assert fronted and all(de.split(", ")[1].split()[0] in FINITE for de in fronted)


def test_synthetic_agreement_and_vocabulary():
    pairs = _pairs(3000)
    de_words = {w.strip(".,?") for _, de in pairs for w in de.split()}
    en_words = {w.strip(".,?") for en, _ in pairs for w in en.split()}
    for form in ("der", "die", "das", "den", "dem", "im", "einen", "einem", "zwei", "zwölf",
                 "hat", "ist", "großer", "großen", "großes", "Kindern", "Männer", "sieht", "siehst"):
        assert form in de_words, form
    content = {w.lower() for w in en_words} - {"the", "a", "an", "my", "your", "i", "you", "he", "she",
                                                "we", "they", "me", "him", "her", "us", "them"}
    assert 100 <= len(content) <= 250, len(content)
    assert any(de.startswith(("Ein großer ", "Ein kleiner ", "Ein alter ")) for _, de in pairs)
    questions = [de for en, de in pairs if en.endswith("?")]
    assert questions and all(de.endswith("?") and de.split()[0].lower() in FINITE for de in questions)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _write_gz(path, text):
    with gzip.open(path, "wb") as f:
        f.write(text.encode("utf-8"))


def test_multi30k_from_local_gz(tmp_path):
    require_shared_data(MULTI30K)
    report = multi30k.load_multi30k(str(tmp_path), raw_dir=str(MULTI30K))
    expected = {"train": 29000, "valid": 1014, "test": 1000}
    for split, n in expected.items():
        assert report[split]["kept"] == n
        assert len(_lines(tmp_path / f"{split}.en")) == len(_lines(tmp_path / f"{split}.de")) == n
    assert _lines(tmp_path / "train.de")[0].startswith("Zwei junge weiße Männer")


def _fake_multi30k(raw_dir, de_train="Ein Hund.\nZwei Katzen.\n"):
    os.makedirs(raw_dir, exist_ok=True)
    for name in ("train", "val", "test_2016_flickr"):
        _write_gz(os.path.join(raw_dir, f"{name}.en.gz"), "A dog.\nTwo cats.\n")
        _write_gz(os.path.join(raw_dir, f"{name}.de.gz"), de_train if name == "train" else "Ein Hund.\nZwei Katzen.\n")


def test_multi30k_misaligned_names_the_file(tmp_path):
    _fake_multi30k(tmp_path / "raw", de_train="Ein Hund.\nZwei Katzen.\nDrei.\n")
    with pytest.raises(pipeline.DataError, match=r"train\.de\.gz has 3 lines but .*train\.en\.gz has 2"):
        multi30k.load_multi30k(str(tmp_path / "out"), raw_dir=str(tmp_path / "raw"))


def test_multi30k_missing_file_names_file_and_flag(tmp_path):
    _fake_multi30k(tmp_path / "raw")
    os.remove(tmp_path / "raw" / "val.de.gz")
    with pytest.raises(pipeline.DataError, match=r"val\.de.*--raw-dir"):
        multi30k.load_multi30k(str(tmp_path / "out"), raw_dir=str(tmp_path / "raw"))


def test_multi30k_plain_files_bad_utf8_and_empty_lines(tmp_path, capsys):
    raw = tmp_path / "raw"
    _fake_multi30k(raw)
    for lang in ("en", "de"):
        os.remove(raw / f"train.{lang}.gz")
    _write(raw / "train.en", b"A dog.\n\nCaf\xe9 time.\r\nTwo\tcats.\n")
    _write(raw / "train.de", "Ein Hund.\nLeer.\nKaffeezeit.\nZwei Katzen.\n".encode("utf-8"))
    report = multi30k.load_multi30k(str(tmp_path / "out"), raw_dir=str(raw))["train"]
    assert report["lines"] == 4 and report["kept"] == 3 and report["dropped_empty"] == 1
    assert report["non_utf8_lines"][str(raw / "train.en")] == 1
    assert _lines(tmp_path / "out" / "train.en") == ["A dog.", "Caf\ufffd time.", "Two cats."]
    assert _lines(tmp_path / "out" / "train.de") == ["Ein Hund.", "Kaffeezeit.", "Zwei Katzen."]
    err = capsys.readouterr().err
    assert "1 lines had invalid UTF-8" in err and "dropped 1 pairs" in err


def test_multi30k_needs_a_source(tmp_path):
    with pytest.raises(pipeline.DataError, match="--raw-dir"):
        multi30k.load_multi30k(str(tmp_path))
    with pytest.raises(pipeline.DataError, match="--raw-dir /nonexistent"):
        multi30k.load_multi30k(str(tmp_path), raw_dir="/nonexistent")


def test_prepare_small_synthetic(tmp_path):
    dest = tmp_path / "bin"
    summary = corpora.prepare("synthetic", str(dest), vocab_size=200, seed=3,
                              synthetic_sizes=dict(n_train=300, n_valid=30, n_test=30))
    for name in ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "train.en-de.de.idx",
                 "test.en-de.de.bin", "spm.model", "prepare.json"):
        assert (dest / name).is_file(), name
    assert summary["counts"] == {"train": 300, "valid": 30, "test": 30}
    assert summary["settings"] == corpora.prepare_settings(
        "synthetic", 200, 3, dict(n_train=300, n_valid=30, n_test=30))
    assert corpora.prepared_settings(str(dest)) == summary["settings"]
    assert 50 < summary["dictionary_size"] <= 200 + 4
    pieces = _lines(tmp_path / "bin" / "work" / "spm" / "train.spm.de")
    assert len(pieces) == 300 and all("\u2581" in p for p in pieces)


SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")


def _run_script(*args):
    """prepare_data.py's ``main`` in this process (tests/inprocess.py: its stdout, stderr and exit
    status as a subprocess gives them), without the fixes to fairseq, as a user runs it;
    test_prepare_data_cli_help runs the script itself."""
    return run_in_process("realformer-prepare-data", *args, check=False, cwd=REPO, fixes=False, argv0=SCRIPT)


def test_prepare_data_cli_bad_raw_dir_is_one_line(tmp_path):
    proc = _run_script("--corpus", "multi30k", "--raw-dir", "/nonexistent", "--dest", str(tmp_path / "dest"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--raw-dir" in lines[0] and "/nonexistent" in lines[0], proc.stderr
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("typed", ["realformer-prepare-data", "prepare_data.py"])
def test_its_errors_begin_with_the_command_the_user_typed(tmp_path, typed):
    """As the wheel's console command its one-line errors begin ``realformer-prepare-data:
    error:``, from a checkout ``prepare_data.py: error:``: the name argparse gives its own usage
    errors (``sys.argv[0]``'s basename), for the project's checks and argparse's alike."""
    argv0 = SCRIPT if typed.endswith(".py") else None  # None: <venv>/bin/realformer-prepare-data
    for args in (["--corpus", "multi30k", "--raw-dir", "/nonexistent", "--dest", tmp_path / "dest"], ["--bogus"]):
        proc = run_in_process("realformer-prepare-data", *args, check=False, cwd=REPO, fixes=False, argv0=argv0)
        assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith(f"{typed}: error: "), proc.stderr


def test_prepare_data_cli_help():
    """The script as a user runs it, in its own process."""
    env = dict(os.environ, REALFORMER_NMT_DATA_FIXES="0")
    proc = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=env)
    assert proc.returncode == 0 and "--raw-dir" in proc.stdout and "--corpus" in proc.stdout


def test_multi30k_download_uses_official_urls_and_reports_failure(tmp_path, monkeypatch):
    import io
    import urllib.error

    requested = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        if "test_2016_flickr.de" in url:
            raise urllib.error.URLError("no network")
        text = "Ein Hund.\n" if url.endswith(".de.gz") else "A dog.\n"
        return io.BytesIO(gzip.compress(text.encode("utf-8")))

    monkeypatch.setattr(multi30k.urllib.request, "urlopen", fake_urlopen)
    with pytest.raises(pipeline.DataError, match=r"could not download https://raw\.githubusercontent\.com/"
                                                r"multi30k/dataset/master/data/task1/raw/test_2016_flickr\.de\.gz"):
        multi30k.load_multi30k(str(tmp_path), download=True)
    assert requested[0] == multi30k.MULTI30K_URL.format(name="train", lang="en")
    assert _lines(tmp_path / "train.de") == ["Ein Hund."] and _lines(tmp_path / "valid.en") == ["A dog."]


# --------------------------------------------------------------------------------------
# Any two Multi30k languages, in either direction
# --------------------------------------------------------------------------------------

def test_multi30k_any_pair_from_the_shared_corpus(tmp_path):
    """French->German from the shared copy: each side is that language's official file."""
    require_shared_data(MULTI30K)
    if not os.path.exists(os.path.join(MULTI30K, "train.fr.gz")):
        pytest.skip("the shared Multi30k copy has no French side")
    report = multi30k.load_multi30k(str(tmp_path), raw_dir=str(MULTI30K), langs=("fr", "de"))
    for split, name in multi30k.MULTI30K_FILES.items():
        for lang in ("fr", "de"):
            with gzip.open(os.path.join(MULTI30K, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
                official = [" ".join(line.split()) for line in f.read().splitlines()]
            assert _lines(tmp_path / f"{split}.{lang}") == official, (split, lang)
        assert report[split]["kept"] == {"train": 29000, "valid": 1014, "test": 1000}[split]
    assert not (tmp_path / "train.en").exists()


def _fake_multi30k_fr(raw_dir):
    _fake_multi30k(raw_dir)
    for name in ("train", "val", "test_2016_flickr"):
        _write_gz(os.path.join(raw_dir, f"{name}.fr.gz"), "Un chien qui court.\nDeux chats noirs.\n")


def test_prepare_records_languages_and_the_harness_reads_them(tmp_path):
    from realformer_tools.experiments import compare

    _fake_multi30k_fr(tmp_path / "raw")
    dest = tmp_path / "bin"
    summary = corpora.prepare("multi30k", str(dest), raw_dir=str(tmp_path / "raw"), vocab_size=60,
                              src="en", tgt="fr")
    for name in ("dict.en.txt", "dict.fr.txt", "train.en-fr.en.bin", "train.en-fr.fr.idx",
                 "test.en-fr.fr.bin", "spm.model", "prepare.json"):
        assert (dest / name).is_file(), name
    assert (summary["src"], summary["tgt"], summary["bpe"], summary["bleu"]) == ("en", "fr", "sentencepiece",
                                                                                 "sacrebleu")
    assert _lines(summary["test_files"]["tgt"]) == ["Un chien qui court.", "Deux chats noirs."]
    # target pieces per source piece, counted independently from the piece files
    spm_dir = tmp_path / "bin" / "work" / "spm"
    n = {lang: sum(len(line.split()) for line in _lines(spm_dir / f"train.spm.{lang}")) for lang in ("en", "fr")}
    assert summary["length_ratio"] == pytest.approx(n["fr"] / n["en"], abs=1e-4)
    assert corpora.prepared_settings(str(dest)) == summary["settings"]
    assert (summary["settings"]["src"], summary["settings"]["tgt"]) == ("en", "fr")

    info = compare.corpus_info(str(dest))
    assert (info["src"], info["tgt"], info["title"]) == ("en", "fr", "Multi30k En->Fr")
    assert compare.test_references(str(dest)) == summary["test_files"]["tgt"]
    flags = compare.Recipe().generate_flags(info)
    tenths = math.floor(summary["length_ratio"] * 10 + 0.5)
    assert flags[flags.index("--max-len-a") + 1] == str(max(1.5, math.floor(1.5 * tenths + 0.5) / 10))
    assert flags[flags.index("--remove-bpe") + 1] == "sentencepiece"


def test_max_len_a_keeps_en_de_at_its_committed_bound():
    """The committed En->De results decoded with --max-len-a 1.5: its measured piece ratio
    (1.0346) must still give 1.5, and En->Fr's (1.13) the 1.7 its runs used."""
    from realformer_tools.experiments.translation.recipe import max_len_a

    assert [max_len_a(r) for r in (None, 0.8, 1.0346, 1.13, 1.26)] == [1.5, 1.5, 1.5, 1.7, 2.0]


def test_en_de_data_without_language_records_keeps_its_bounds(tmp_path):
    """A data dir prepared before prepare.json named languages reads as En->De, bound 1.5x+10."""
    from realformer_tools.experiments import compare

    (tmp_path / "prepare.json").write_text('{"raw_dir": "/x", "settings": {"corpus": "multi30k"}}')
    info = compare.corpus_info(str(tmp_path))
    assert (info["src"], info["tgt"], info["references"], info["title"]) == ("en", "de", "/x/test.de",
                                                                              "Multi30k En->De")
    flags = compare.Recipe().generate_flags(info)
    assert flags[flags.index("--max-len-a") + 1] == "1.5" and flags[flags.index("--max-len-b") + 1] == "10"
    assert corpora.prepare_settings("multi30k") == corpora.prepare_settings("multi30k", src="en", tgt="de")
    assert "src" not in corpora.prepare_settings("multi30k")


@pytest.mark.parametrize("args, needle", [
    (("--src", "fr", "--tgt", "fr"), "--src and --tgt are both 'fr'"),
    (("--src", "cs"), "--src"),
    (("--corpus", "synthetic", "--tgt", "fr"), "--corpus synthetic is English->German only"),
])
def test_prepare_data_cli_bad_languages_are_one_line(tmp_path, args, needle):
    base = ("--corpus", "multi30k", "--raw-dir", str(tmp_path)) if "--corpus" not in args else ()
    proc = _run_script(*base, *args, "--dest", str(tmp_path / "dest"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("corpus, raw_dir, needles", [
    ("multi30k", "../shared/data/multi30k-missing", ["is not a directory: give --download",
                                                      "github.com/multi30k/dataset", "or --raw-dir a folder holding",
                                                      "train.en, train.de, val.en, val.de, test_2016_flickr.en, "
                                                      "test_2016_flickr.de (plain or .gz)"]),
    ("multi30k", "{empty}", ["has no train.en[.gz]: give --download", "test_2016_flickr.de (plain or .gz)"]),
    ("iwslt14", "../shared/data/iwslt14-missing", ["is not a directory: give --download (fetches fairseq's "
                                                    "de-en.tgz) or --raw-dir a folder holding de-en.tgz"]),
])
def test_a_raw_dir_that_is_missing_names_both_ways_to_get_the_corpus(tmp_path, corpus, raw_dir, needles):
    """The quick start's --raw-dir exists in one workspace only: elsewhere the one-line error
    says what to do, --download or a folder of the official files, named."""
    (tmp_path / "empty").mkdir()
    raw_dir = raw_dir.format(empty=tmp_path / "empty")
    proc = _run_script("--corpus", corpus, "--raw-dir", raw_dir, "--dest", str(tmp_path / "dest"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"prepare_data.py: error: --raw-dir {raw_dir} ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "dest").exists()
    with pytest.raises(pipeline.DataError, match="give --download .* or --raw-dir a folder holding them: "
                                                 r"train\.fr, train\.en, val\.fr"):
        multi30k.check_multi30k_source(str(tmp_path / "empty"), langs=("fr", "en"))


# --------------------------------------------------------------------------------------
# Multi30k's three test sets: test_2016_flickr (split test), test_2017_flickr and
# test_2017_mscoco (splits test1, test2), with the same dictionaries and SentencePiece model
# --------------------------------------------------------------------------------------

def _real_slices(raw_dir, with_2017=True):
    """The first lines of the shared Multi30k files (En, De), gzipped as the official ones are."""
    require_shared_data(MULTI30K)
    sizes = {"train": 300, "val": 24, "test_2016_flickr": 20, "test_2017_flickr": 16, "test_2017_mscoco": 12}
    os.makedirs(raw_dir, exist_ok=True)
    for name, n in sizes.items():
        if name.startswith("test_2017") and not with_2017:
            continue
        for lang in ("en", "de"):
            with gzip.open(os.path.join(MULTI30K, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
                _write_gz(os.path.join(raw_dir, f"{name}.{lang}.gz"), "".join(f.readlines()[:n]))


def _digests(folder):
    import hashlib

    return {os.path.relpath(os.path.join(d, n), folder): hashlib.md5(open(os.path.join(d, n), "rb").read()).hexdigest()
            for d, _, names in os.walk(folder) for n in names}


def test_multi30k_three_test_sets_fresh_or_added_later_give_the_same_binaries(tmp_path):
    """A fresh prepare binarizes test_2017_flickr / _mscoco as test1 / test2 and leaves the
    other binaries and the dictionaries as a prepare without them makes them; adding them
    later to a folder prepared without them rewrites none of its files (prepare.json keeps
    every key and value it had) and gives byte-identical test1 / test2 binaries."""
    require_shared_data(MULTI30K)
    full, old = tmp_path / "raw_full", tmp_path / "raw_2016_only"
    _real_slices(full)
    _real_slices(old, with_2017=False)
    fresh = corpora.prepare("multi30k", str(tmp_path / "fresh"), raw_dir=str(full), vocab_size=120)
    assert fresh["test_sets"] == {"test": "test_2016_flickr", "test1": "test_2017_flickr", "test2": "test_2017_mscoco"}
    assert fresh["counts"] == {"train": 300, "valid": 24, "test": 20, "test1": 16, "test2": 12}
    with gzip.open(os.path.join(MULTI30K, "test_2017_mscoco.de.gz"), "rt", encoding="utf-8") as f:
        assert _lines(fresh["test_set_files"]["test2"]["tgt"]) == [" ".join(x.split()) for x in f.readlines()[:12]]

    before = corpora.prepare("multi30k", str(tmp_path / "before"), raw_dir=str(old), vocab_size=120)
    assert before["test_sets"] == {"test": "test_2016_flickr"}
    a, b = _digests(tmp_path / "fresh"), _digests(tmp_path / "before")
    shared = [n for n in b if n.endswith((".bin", ".idx")) or n.startswith("dict.")]
    assert len(shared) == 14 and all(a[n] == b[n] for n in shared)  # the 2017 sets change nothing else

    old_record = json.loads((tmp_path / "before" / "prepare.json").read_text())
    added = corpora.add_test_sets(str(tmp_path / "before"), raw_dir=str(full))
    after = _digests(tmp_path / "before")
    assert {n: after[n] for n in b if n != "prepare.json"} == {n: b[n] for n in b if n != "prepare.json"}
    new = sorted(set(after) - set(b))
    assert [n for n in new if not n.startswith("work")] == sorted(
        f"{s}.en-de.{lang}.{ext}" for s in ("test1", "test2") for lang in ("de", "en") for ext in ("bin", "idx"))
    assert all(after[n] == a[n] for n in new if not n.startswith("work"))
    record = json.loads((tmp_path / "before" / "prepare.json").read_text())
    for key, value in old_record.items():
        if key in ("counts", "report", "test_sets", "test_set_files"):  # extended, not changed
            assert {k: record[key][k] for k in value} == value, key
        else:
            assert record[key] == value, key
    assert record["test_sets"] == added["test_sets"] == fresh["test_sets"]
    # the harness reads the three sets, the headline first
    from realformer_tools.experiments.translation.recipe import corpus_info

    sets = corpus_info(str(tmp_path / "before"))["test_sets"]
    assert [(t["split"], t["name"]) for t in sets] == [("test", "test_2016_flickr"), ("test1", "test_2017_flickr"),
                                                        ("test2", "test_2017_mscoco")]
    assert _lines(sets[1]["references"]) == _lines(fresh["test_set_files"]["test1"]["tgt"])

    # again: nothing changes; a different file where a new one would go is refused, nothing moved
    corpora.add_test_sets(str(tmp_path / "before"), raw_dir=str(full))
    assert _digests(tmp_path / "before") == after
    os.remove(tmp_path / "before" / "test2.en-de.de.bin")
    _write(tmp_path / "before" / "test2.en-de.de.bin", b"not this")
    with pytest.raises(pipeline.DataError, match=r"test2\.en-de\.de\.bin exists and differs"):
        corpora.add_test_sets(str(tmp_path / "before"), raw_dir=str(full))
    assert (tmp_path / "before" / "test2.en-de.de.bin").read_bytes() == b"not this"
    assert not [n for n in os.listdir(tmp_path / "before") if n.startswith(".add_test_sets")]


def test_add_test_sets_cli_refuses_what_it_cannot_add(tmp_path):
    proc = _run_script("--add-test-sets", "--dest", str(tmp_path / "syn"))
    assert proc.returncode == 2 and "--add-test-sets only applies to --corpus multi30k" in proc.stderr
    proc = _run_script("--corpus", "multi30k", "--add-test-sets", "--dest", str(tmp_path / "none"))
    assert proc.returncode == 2 and "has no prepare.json: prepare it first" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "none").exists()
