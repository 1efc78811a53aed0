"""IWSLT'14 De-En as fairseq's prepare-iwslt14.sh makes it (scripts/prepare_data.py --corpus
iwslt14, realformer_tools/data/iwslt14.py), from a tiny archive in the original format whose
expected output is written by hand (iwslt14_fixture.py), and BLEU as papers report it for
it: fairseq's tokenized BLEU as the headline, sacreBLEU of detokenized output beside it.
"""

import io
import json
import os
import random
import subprocess
import sys

import pytest
import sacrebleu
from conftest import REPO, cli_env
from inprocess import run_in_process
from iwslt14_fixture import write_archive

from realformer_nmt.errors import ConfigError, DataError
from realformer_tools.data import corpora, iwslt14
from realformer_tools.experiments import compare, fairseq_runs

MERGES = 40  # the recipe's 10,000 scaled down to the fixture


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


SCRIPT = REPO / "scripts" / "prepare_data.py"


def _script(*args):
    """The script as a user runs it, in its own process."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, env=cli_env(), timeout=300)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The fixture archive through the command line: (dest, expected, summary)."""
    root = tmp_path_factory.mktemp("iwslt14")
    expected = write_archive(root / "raw")
    dest = root / "bin"
    proc = _script("--corpus", "iwslt14", "--raw-dir", root / "raw", "--dest", dest, "--bpe-merges", MERGES,
                   "--workers", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dest, expected, json.loads(proc.stdout)


def test_split_cleaning_and_test_order_follow_the_script(prepared):
    dest, expected, summary = prepared
    tok = dest / "work" / "tok"
    for lang in ("de", "en"):
        for split in ("train", "valid", "test"):
            assert _lines(tok / f"{split}.{lang}") == expected[split][lang], (split, lang)
        assert _lines(tok / f"test.raw.{lang}") == expected["test_raw"][lang]
    assert len(expected["valid"]["de"]) == expected["kept"] // 23 >= 2
    assert summary["counts"] == {s: len(expected[s]["de"]) for s in ("train", "valid", "test")}
    clean = summary["report"]["clean"]
    assert {k: v for k, v in clean["dropped"].items() if v} == expected["dropped"]
    assert clean["output"] == expected["kept"]
    assert summary["report"]["tag_lines_dropped"] == {"de": expected["tag_lines"], "en": expected["tag_lines"]}
    assert summary["report"]["test_sets"] == {name: {"de": 2, "en": 2} for name in iwslt14.TEST_SETS}


def test_bpe_is_learned_on_both_sides_and_applied_to_every_split(prepared):
    from subword_nmt.learn_bpe import learn_bpe

    dest, expected, _ = prepared
    codes = _lines(dest / "code")
    assert codes[0].startswith("#version") and len(codes) - 1 == MERGES
    both = io.StringIO()  # learn_bpe.py -s MERGES < train.de + train.en, as the script concatenates them
    learn_bpe([line + "\n" for lang in ("de", "en") for line in expected["train"][lang]], both, MERGES)
    assert codes == both.getvalue().splitlines()
    de_only = io.StringIO()
    learn_bpe([line + "\n" for line in expected["train"]["de"]], de_only, MERGES)
    assert codes != de_only.getvalue().splitlines()
    bpe = dest / "work" / "bpe"
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            pieces = _lines(bpe / f"{split}.{lang}")
            assert [(p + " ").replace("@@ ", "").rstrip() for p in pieces] == expected[split][lang]
    assert any("@@" in line for line in _lines(bpe / "test.en"))  # the merges split unseen words


def test_binaries_and_prepare_json_are_what_the_harness_reads(prepared):
    from fairseq.data import Dictionary, data_utils

    dest, expected, summary = prepared
    dicts = {lang: Dictionary.load(str(dest / f"dict.{lang}.txt")) for lang in ("de", "en")}
    assert dicts["de"].symbols != dicts["en"].symbols  # separate dictionaries, as fairseq's README
    assert summary["dictionary_sizes"] == {lang: len(d) for lang, d in dicts.items()}
    assert summary["dictionary_size"] == len(dicts["en"])
    test_en = data_utils.load_indexed_dataset(str(dest / "test.de-en.en"), dicts["en"])
    # pieces the training text never produced are <unk> in the binaries, as with fairseq's own recipe
    pieces = [" ".join(p if p in dicts["en"].indices else "<unk>" for p in line.split())
              for line in _lines(dest / "work" / "bpe" / "test.en")]
    assert [dicts["en"].string(test_en[i]) for i in range(len(test_en))] == pieces
    assert len(data_utils.load_indexed_dataset(str(dest / "train.de-en.de"), dicts["de"])) == len(
        expected["train"]["de"])

    with open(dest / "prepare.json", encoding="utf-8") as f:
        assert json.load(f) == summary
    assert (summary["src"], summary["tgt"], summary["bpe"], summary["bleu"]) == ("de", "en", "subword_nmt",
                                                                                 "tokenized")
    assert summary["joined_dictionary"] is False
    assert _lines(summary["test_files"]["tgt"]) == expected["test_raw"]["en"]
    assert _lines(summary["test_files"]["src"]) == expected["test_raw"]["de"]
    n = {lang: sum(len(line.split()) for line in _lines(dest / "work" / "bpe" / f"train.{lang}"))
         for lang in ("de", "en")}
    assert summary["length_ratio"] == pytest.approx(n["en"] / n["de"], abs=1e-4)
    assert summary["settings"] == corpora.prepare_settings("iwslt14", raw_dir=str(dest.parent / "raw"), src="de",
                                                           tgt="en", bpe_merges=MERGES)
    assert corpora.prepared_settings(str(dest)) == summary["settings"]

    info = compare.corpus_info(str(dest))
    assert (info["src"], info["tgt"], info["bleu"], info["title"]) == ("de", "en", "tokenized", "IWSLT'14 De->En")
    assert compare.test_references(str(dest)) == summary["test_files"]["tgt"]
    flags = compare.Recipe().generate_flags(info)
    assert flags[flags.index("--remove-bpe") + 1] == "subword_nmt"
    model = compare.Recipe().model_flags(info)
    assert "--share-decoder-input-output-embed" in model and "--share-all-embeddings" not in model
    record = compare.recipe_record(compare.Recipe(), str(dest), summary["test_files"]["tgt"], ["postln"], "sum", [1])
    assert record["scoring"].startswith("headline: fairseq-generate's tokenized BLEU")
    assert record["corpus"]["bleu"] == "tokenized"


def test_the_extracted_folder_gives_the_same_binaries(prepared, tmp_path):
    dest, _, summary = prepared
    write_archive(tmp_path / "raw", extracted=True)
    other = corpora.prepare("iwslt14", str(tmp_path / "bin"), raw_dir=str(tmp_path / "raw"), src="de", tgt="en",
                            bpe_merges=MERGES)
    assert other["counts"] == summary["counts"]
    for name in ("dict.de.txt", "dict.en.txt", "code", "train.de-en.de.bin", "valid.de-en.en.bin",
                 "test.de-en.en.bin", "test.de-en.de.idx"):
        assert (tmp_path / "bin" / name).read_bytes() == (dest / name).read_bytes(), name


def test_clean_corpus_rules():
    pairs, report = iwslt14.clean_corpus(
        ["a  b\tc", "a", "a b", "", "a b|c", "x" * 1001, " ".join("w" * 175)],
        ["a b c", "a b c", "a b c", "a", "a b c", "y", " ".join("w" * 175)])
    # whitespace squeezed, ratio 1.5 kept and 3.0 dropped, empty dropped, "|" removed (not factored)
    assert pairs == [("a b c", "a b c"), ("a b", "a b c"), ("a bc", "a b c"),
                     (" ".join("w" * 175), " ".join("w" * 175))]
    assert report["dropped"] == {"empty": 1, "length": 0, "ratio": 1, "word_length": 1}
    factored, _ = iwslt14.clean_corpus(["a|X b|Y"], ["c|Z"], ratio=9)
    assert factored == [("a|X b|Y", "c|Z")]
    with pytest.raises(DataError, match="not aligned"):
        iwslt14.clean_corpus(["a"], [])


# (text, what lowercase.perl prints): a word-final capital sigma is "σ" for Perl's lc, which has
# no Final_Sigma rule (Python's str.lower gives "ς"); the rest is plain per-character lowercase
LOWERCASE_CASES = [("ΟΔΟΣ ΣΑΣ", "οδοσ σασ"), ("ΣΟΦΙΑ.", "σοφια."), ("Σ", "σ"), ("ΑΣ, Ω", "ασ, ω"),
                   ("Straße ÄÖÜ", "straße äöü"), ("İstanbul", "i\u0307stanbul"), ("ﬀ ǅ Ǆ", "ﬀ ǆ ǆ"),
                   ("ς already small", "ς already small")]


@pytest.mark.parametrize("text, expected", LOWERCASE_CASES)
def test_lowercase_is_perls_lc_without_final_sigma(text, expected):
    assert "ς" in "ΟΔΟΣ".lower()  # the rule that must not apply
    assert iwslt14.lowercase([text]) == [expected]


def test_lowercase_matches_perls_lc_on_every_character_and_in_words():
    """lowercase.perl is ``print lc($_)`` on UTF-8 lines: compared with perl itself."""
    import shutil

    if shutil.which("perl") is None:
        pytest.skip("perl is not installed")
    chars = [chr(c) for c in range(0x20, 0x20000) if not 0xD800 <= c < 0xE000]
    lines = [" ".join(chars[i:i + 64]) for i in range(0, len(chars), 64)]
    lines += [text for text, _ in LOWERCASE_CASES] + ["ΑΒΓΔΣ ΣΤΟ ΚΟΣΜΟΣ. ΟΣ", "ΘΕΟΣ, ΛΟΓΟΣ!"]
    perl = subprocess.run(["perl", "-CSD", "-ne", "print lc"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, encoding="utf-8", check=True).stdout
    assert iwslt14.lowercase(lines) == perl.split("\n")[:-1]


def test_tag_lines_and_seg_lines_as_grep_and_sed_do():
    lines, dropped = iwslt14.strip_train_tags(["<url>u</url>", "x <talkid>1</talkid>", "<keywords>k</keywords>",
                                               "<title>T</title>", "<description>D.</description>", "Text."])
    assert (lines, dropped) == (["T", "D.", "Text."], 3)
    assert iwslt14.seg_lines(['<doc docid="1">', '  <seg id="12">  It\u2019s here.  </seg> ', "<talkid>3</talkid>",
                              '<seg id="13"></seg>']) == ["  It's here.", ""]


def test_download_fetches_the_recipes_archive(tmp_path, monkeypatch):
    import urllib.error

    write_archive(tmp_path / "src")
    payload = (tmp_path / "src" / "de-en.tgz").read_bytes()
    requested = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(iwslt14.urllib.request, "urlopen", fake_urlopen)
    folder = iwslt14.find_raw_files(download=True, work_dir=str(tmp_path / "work"))
    assert requested == ["https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"]
    assert sorted(os.listdir(folder)) == sorted(iwslt14.needed_files() + ["IWSLT14.TED.tst2013.de-en.de.xml",
                                                                           "IWSLT14.TED.tst2013.de-en.en.xml"])

    requested.clear()  # a re-run reuses the finished download
    assert iwslt14.find_raw_files(download=True, work_dir=str(tmp_path / "work")) == folder and not requested

    def offline(url, timeout=None):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(iwslt14.urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match=r"could not download https://dl\.fbaipublicfiles\.com/.*--raw-dir"):
        iwslt14.find_raw_files(download=True, work_dir=str(tmp_path / "work2"))


def test_a_missing_or_misaligned_file_is_named(tmp_path):
    write_archive(tmp_path / "raw", extracted=True)
    os.remove(tmp_path / "raw" / "de-en" / "IWSLT14.TEDX.dev2012.de-en.en.xml")
    with pytest.raises(DataError, match=r"IWSLT14\.TEDX\.dev2012\.de-en\.en\.xml .*--raw-dir"):
        iwslt14.find_raw_files(raw_dir=str(tmp_path / "raw"))
    write_archive(tmp_path / "raw2", extracted=True)
    path = tmp_path / "raw2" / "de-en" / "IWSLT14.TED.tst2011.de-en.de.xml"
    path.write_text(path.read_text(encoding="utf-8").replace("</doc>", '<seg id="3">Noch einer.</seg>\n</doc>'),
                    encoding="utf-8")
    with pytest.raises(DataError, match=r"IWSLT14\.TED\.tst2011\.de-en\.de\.xml has 3 <seg> lines"):
        corpora.prepare("iwslt14", str(tmp_path / "bin"), raw_dir=str(tmp_path / "raw2"), src="de", tgt="en",
                        bpe_merges=MERGES)


@pytest.mark.parametrize("args, needle", [
    (("--corpus", "iwslt14"), "--corpus iwslt14 needs --raw-dir DIR"),
    (("--corpus", "iwslt14", "--raw-dir", "{empty}"), "holds neither de-en.tgz nor a de-en/ folder"),
    (("--corpus", "iwslt14", "--download", "--src", "en", "--tgt", "de"), "German->English only"),
    (("--corpus", "iwslt14", "--download", "--vocab-size", "8000"), "--vocab-size is a SentencePiece setting"),
    (("--corpus", "multi30k", "--download", "--bpe-merges", "10"), "--bpe-merges is a subword-nmt setting"),
])
def test_prepare_data_cli_iwslt14_errors_are_one_line(tmp_path, args, needle):
    (tmp_path / "empty").mkdir()
    args = [a.format(empty=tmp_path / "empty") for a in args]
    # its main in this process (tests/inprocess.py: stdout, stderr and exit status as a subprocess
    # gives them); the module fixture `prepared` runs the script itself
    proc = run_in_process("realformer-prepare-data", *args, "--dest", tmp_path / "dest", check=False, fixes=False,
                          argv0=SCRIPT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "dest").exists()


# --------------------------------------------------------------------------------------
# BLEU as papers report it
# --------------------------------------------------------------------------------------

def _fairseq_bleu_line(refs, hyps):
    """The score line fairseq-generate prints with its default scorer, made by fairseq's own
    BLEU scorer on dictionary-encoded tokens as generate.py feeds it."""
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer

    d = Dictionary()
    scorer = Scorer(BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for ref, hyp in zip(refs, hyps):
        scorer.add(d.encode_line(ref, add_if_not_exist=True), d.encode_line(hyp, add_if_not_exist=True))
    return f"2026-01-01 00:00:00 | INFO | fairseq_cli.generate | Generate test with beam=5: {scorer.result_string()}"


# tokenized lowercased references / hypotheses, and by hand: the raw reference and the detokenized hypothesis
SENTENCES = [
    ("it &apos;s a big house .", "it &apos;s a big house .", "It's a big house.", "it's a big house."),
    ("he said &quot; hello &quot; to me .", "he said &quot; hi &quot; to me .", 'He said "hello" to me.',
     'he said "hi" to me.'),
    ("we have 1,000 people , here and there .", "we have 1,000 people here and there .",
     "We have 1,000 people, here and there.", "we have 1,000 people here and there."),
    ("the city is n&apos;t old .", "the city is not old .", "The city isn't old.", "the city is not old."),
    ("thank you .", "thanks .", "Thank you.", "thanks."),
]


def _generate_output(hyps):
    """fairseq-generate's lines for ``hyps``, in a batch order other than the corpus's."""
    lines = []
    order = list(range(len(hyps)))
    random.Random(3).shuffle(order)
    for i in order:
        lines += [f"S-{i}\tsrc", f"T-{i}\t{SENTENCES[i][0]}", f"H-{i}\t-0.5\t{hyps[i]}", f"D-{i}\t-0.5\t{hyps[i]}",
                  f"P-{i}\t-0.5 -0.5"]
    return lines


def test_tokenized_bleu_is_fairseqs_score_with_sacrebleu_beside():
    refs, hyps, raw_refs, detok = (list(col) for col in zip(*SENTENCES))
    line = _fairseq_bleu_line(refs, hyps)
    scored = fairseq_runs.score_hypotheses(_generate_output(hyps) + [line], raw_refs, "tokenized", "en")
    # the headline: fairseq's number, which is plain corpus BLEU of the tokenized text
    independent = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score
    assert scored["bleu"] == pytest.approx(independent, abs=0.006) and 20 < scored["bleu"] < 90
    assert scored["tokenized_bleu"].startswith(f"BLEU4 = {scored['bleu']:.2f}, ")
    assert scored["convention"] == "tokenized" and "IWSLT'14" in scored["headline"]
    # beside it: sacreBLEU of the Moses-detokenized output against the raw references, lowercased
    beside = sacrebleu.corpus_bleu(detok, [raw_refs], lowercase=True)
    assert scored["sacrebleu_score"] == round(beside.score, 2) and scored["sacrebleu"] == str(beside)
    assert "case:lc" in scored["signature"] and "tok:13a" in scored["signature"]
    assert scored["sacrebleu_score"] != scored["bleu"]


def test_sacrebleu_convention_is_unchanged_and_tokenized_needs_fairseqs_line():
    refs, hyps, raw_refs, detok = (list(col) for col in zip(*SENTENCES))
    lines = [f"D-{i}\t-0.5\t{h}" for i, h in enumerate(detok)]
    scored = fairseq_runs.score_hypotheses(lines, raw_refs)
    cased = sacrebleu.corpus_bleu(detok, [raw_refs])
    assert (scored["bleu"], scored["convention"]) == (round(cased.score, 2), "sacrebleu")
    assert "case:mixed" in scored["signature"]
    with pytest.raises(fairseq_runs.RunError, match="no BLEU line"):
        fairseq_runs.score_hypotheses(_generate_output(hyps), raw_refs, "tokenized", "en")
    with pytest.raises(ConfigError, match="unknown BLEU convention 'bleu4'"):
        fairseq_runs.score_hypotheses(lines, raw_refs, "bleu4")
    with pytest.raises(ConfigError, match="drop --scoring"):
        fairseq_runs.generate_and_score("data", "ckpt", "refs", "out", ["--scoring", "sacrebleu"],
                                        convention="tokenized")


@pytest.mark.slow
def test_harness_compares_on_iwslt14_with_tokenized_bleu(prepared, tmp_path):
    """compare.compare on the fixture: separate dictionaries train; each run's BLEU is
    fairseq-generate's printed tokenized BLEU with lowercased sacreBLEU beside it; the JSON
    and the table say which is the headline; the paired test scores the tokenized text."""
    dest, expected, _ = prepared
    recipe = compare.Recipe(layers=1, embed_dim=16, ffn_dim=32, heads=2, max_update=3, warmup_updates=2,
                            max_tokens=2000, beam=1, log_interval=1)
    results = tmp_path / "iwslt.json"
    # threads=1: one intra-op thread in each fairseq process, as every other harness test gives them (the
    # default, one per core, spins two threads of a tiny model against each other on the suite's two cores)
    summary = compare.compare(str(dest), str(tmp_path / "out"), recipe, backbones=("postln", "realformer"),
                              results_path=str(results), threads=1, log=lambda m: None, bootstrap_samples=50)
    for backbone in ("postln", "realformer"):
        run = fairseq_runs.read_json(str(tmp_path / "out" / backbone / "seed1" / "result.json"))
        assert run["status"] == "finished" and "--share-decoder-input-output-embed" in run["command"]
        assert "--share-all-embeddings" not in run["command"]
        lines = fairseq_runs.read_log(str(tmp_path / "out" / backbone / "seed1" / "generate.txt"))
        assert run["bleu_convention"] == "tokenized" and run["bleu"] == fairseq_runs.fairseq_bleu(lines)[1]
        assert run["tokenized_bleu"].startswith("BLEU4 = ")
        assert "--remove-bpe" in run["generate_command"] and "--scoring" not in run["generate_command"]
        hyps = fairseq_runs.parse_generate_output(lines)
        detok = fairseq_runs.moses_detokenize([hyps[i] for i in range(len(hyps))], "en")
        assert run["sacrebleu"] == str(sacrebleu.corpus_bleu(detok, [expected["test_raw"]["en"]], lowercase=True))
        assert summary[backbone]["bleu_per_seed"] == [run["bleu"]]
        assert summary[backbone]["sacrebleu_per_seed"] == [run["sacrebleu"]]
    written = json.loads(results.read_text(encoding="utf-8"))
    assert written["recipe"]["scoring"].startswith("headline: fairseq-generate's tokenized BLEU")
    assert "case:lc" in written["sacrebleu_signature"]
    (test,) = written["realformer"]["paired_vs_postln"]
    assert "tok:none" in test["signature"]
    assert test["baseline_bleu"] == pytest.approx(written["postln"]["bleu"], abs=0.011)
    assert "Test BLEU (fairseq's tokenized BLEU after --remove-bpe" in results.with_suffix(".md").read_text()


def test_paired_test_of_tokenized_runs_uses_the_headline_bleu(tmp_path):
    """Seed-paired bootstrap on IWSLT'14 runs scores what the headline scores: the hypotheses
    against fairseq-generate's tokenized targets, untokenized further."""
    refs, hyps, raw_refs, _ = (list(col) for col in zip(*SENTENCES))
    worse = [" ".join(reversed(h.split())) for h in hyps]  # no 4-gram left: fairseq's BLEU is 0, unsmoothed
    runs = []
    for name, out in (("postln", hyps), ("realformer", worse)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "generate.txt").write_text("\n".join(_generate_output(out)) + "\n", encoding="utf-8")
        runs.append({"seed": 1, "bleu": 1.0, "bleu_convention": "tokenized", "run_dir": str(tmp_path / name)})
    (test,) = compare.paired_vs([runs[0]], [runs[1]], raw_refs, samples=200)
    fairseq_score = {n: float(_fairseq_bleu_line(refs, h).split("BLEU4 = ")[1].split(",")[0])
                     for n, h in (("postln", hyps), ("realformer", worse))}
    assert test["baseline_bleu"] == pytest.approx(fairseq_score["postln"], abs=0.011)
    assert test["system_bleu"] == pytest.approx(fairseq_score["realformer"], abs=0.011)
    assert fairseq_score["realformer"] == 0 < fairseq_score["postln"]
    assert "tok:none" in test["signature"] and "case:mixed" in test["signature"]
    runs[1]["bleu_convention"] = "sacrebleu"  # Multi30k runs keep the raw references and 13a
    assert fairseq_runs.paired_test_references(runs[1], raw_refs) == (raw_refs, {})
