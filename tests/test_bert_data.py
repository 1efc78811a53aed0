"""Pre-training data: raw text -> documents -> SentencePiece -> fairseq binaries
(``scripts/prepare_pretraining_data.py``), and BERT's sentence pairs for NSP."""

import json
import os
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from bert_helpers import REPO, WIKITEXT2, prepared_wikitext2
from fairseq.data import Dictionary, data_utils
from inprocess import run_in_process

from realformer_nmt.errors import DataError
from realformer_nmt.tasks.masked_lm_nsp import MaskedLMNextSentenceTask, MaskedLMNSPConfig
from realformer_nmt.tasks.next_sentence_pairs import (
    NextSentenceLabelDataset,
    NextSentencePairsDataset,
    build_segments,
    document_spans,
)
from realformer_tools.data import pretraining, wikitext

SCRIPT = REPO / "scripts" / "prepare_pretraining_data.py"


def script(*args):
    """The script's main in this process (tests/inprocess.py: stdout, stderr and exit status as a
    subprocess gives them); --help runs the script itself."""
    return run_in_process("realformer-prepare-pretraining-data", *args, check=False, fixes=False, argv0=SCRIPT)

# --------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------

# WikiText's own layout: every line starts and ends with a space, empty lines hold one space
WIKI_SAMPLE = "".join(line + "\n" for line in [
    ' ',
    ' = Alpha = ',
    ' ',
    ' Alpha is a letter . It comes first . ',
    ' ',
    ' = = History = = ',
    ' ',
    ' The history of alpha is long . ',
    ' = = = Early use = = = ',
    ' Early use of <unk> letters . ',
    ' ',
    ' = Beta = ',
    ' ',
    ' Beta comes second . ',
])


def test_wikitext_titles_split_documents_and_headings_are_dropped():
    lines = [" ".join(line.split()) for line in WIKI_SAMPLE.splitlines()]
    documents, stats = wikitext.split_documents(lines)
    assert documents == [
        ["Alpha is a letter . It comes first .", "The history of alpha is long .", "Early use of <unk> letters ."],
        ["Beta comes second ."],
    ]
    assert stats["documents_by"] == "wikitext_titles" and stats["headings_dropped"] == 4


def test_plain_text_documents_are_separated_by_empty_lines():
    lines = ["", "First doc line one.", "First doc line two.", "", "", "Second doc.", "", "Third = doc."]
    documents, stats = wikitext.split_documents(lines)
    assert documents == [["First doc line one.", "First doc line two."], ["Second doc."], ["Third = doc."]]
    assert stats["documents_by"] == "empty_lines"


@pytest.mark.parametrize("line, level", [
    ("= Robert <unk> =", 1), ("= = Career = =", 2), ("= = = 2000 – 2005 = = =", 3),
    ("a = b", 0), ("= = Unbalanced =", 0), ("= =", 0), ("", 0),
])
def test_heading_levels(line, level):
    assert wikitext.heading_level(line) == level


def _raw_title_count(path):
    """Articles of a WikiText file, counted independently of the code under test."""
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if re.fullmatch(r" = [^=].* = \n", line))


# --------------------------------------------------------------------------------------
# prepare_pretraining on a small corpus
# --------------------------------------------------------------------------------------

WORDS = ("the cat dog bird sat ran flew over under near a red blue green house tree river "
         "quickly slowly and then because it was".split())


def _write_corpus(raw, n_docs=(12, 4), seed=0, names=("train.txt", "valid.txt")):
    rng = random.Random(seed)
    for name, docs in zip(names, n_docs):
        out = []
        for d in range(docs):
            out += ["", f" = Article {name[:5]} {d} = ", ""]
            for _ in range(rng.randint(2, 5)):
                out.append(" " + " . ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
                                           for _ in range(rng.randint(1, 3))) + " . ")
                out.append("")
        out[5] = out[5] + " <unk> ."  # one WikiText out-of-vocabulary marker
        (raw / name).write_text("\n".join(out) + "\n", encoding="utf-8")


def _decoded_binary(out, split):
    """The binarized split read back with fairseq and decoded with the SentencePiece model."""
    import sentencepiece as spm

    d = Dictionary.load(str(out / "dict.txt"))
    data = data_utils.load_indexed_dataset(str(out / split), d)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    return [sp.decode_pieces(d.string(data[i]).split()) for i in range(len(data))], data, d


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """(raw dir, prepared data dir, summary) of a small WikiText-like corpus."""
    raw = tmp_path_factory.mktemp("raw")
    _write_corpus(raw)
    out = tmp_path_factory.mktemp("small") / "bin"
    summary = pretraining.prepare_pretraining(str(raw), str(out), vocab_size=60, log=lambda m: None)
    return raw, out, summary


def _expected_lines(path):
    documents, _ = wikitext.split_documents([" ".join(line.split()) for line in path.read_text().splitlines()])
    expected = []
    for i, doc in enumerate(documents):
        expected += ([""] if i else []) + doc  # one empty line between documents
    return expected, len(documents)


def test_prepare_round_trips_the_documents(small_corpus):
    raw, out, summary = small_corpus
    for split, name in (("train", "train.txt"), ("valid", "valid.txt")):
        expected, n_docs = _expected_lines(raw / name)
        decoded, data, d = _decoded_binary(out, split)
        assert decoded == expected
        assert summary["documents"][split]["documents"] == n_docs
        # an empty line is an EOS-only item, the document boundary fairseq reads
        assert sum(int(data.sizes[i] == 1) for i in range(len(data))) == n_docs - 1
    # WikiText's literal <unk> is fairseq's <unk>, one token
    _, data, d = _decoded_binary(out, "train")
    assert sum(int((data[i] == d.unk()).sum()) for i in range(len(data))) == 1
    assert json.loads((out / "prepare.json").read_text())["key"] == summary["key"]
    assert summary["dictionary_size"] == len(Dictionary.load(str(out / "dict.txt"))) + 1  # + <mask>


@pytest.mark.slow  # 10-20 s under load: full suite only
def test_prepare_is_idempotent_and_resumes(small_corpus, tmp_path):
    raw, prepared_out, _ = small_corpus
    out = tmp_path / "bin"
    shutil.copytree(prepared_out, out)
    stamp = os.stat(out / "train.bin").st_mtime_ns

    messages = []
    pretraining.prepare_pretraining(str(raw), str(out), vocab_size=60, log=messages.append)
    assert any("nothing to do" in m for m in messages)
    assert os.stat(out / "train.bin").st_mtime_ns == stamp

    # interrupted after the SentencePiece step: the next run redoes only what is missing
    os.remove(out / "prepare.json")
    os.remove(out / "work" / "spm" / "valid.spm")
    messages.clear()
    pretraining.prepare_pretraining(str(raw), str(out), vocab_size=60, log=messages.append)
    skipped = [messages[i - 1] for i, m in enumerate(messages) if "skipped" in m]
    assert [s.split()[0] for s in skipped] == ["[1/4]", "[2/4]"]
    assert pretraining.prepared(str(out)) is not None
    assert _decoded_binary(out, "valid")[0] == _expected_lines(raw / "valid.txt")[0]

    # a changed input starts over and lands in the output
    changed = tmp_path / "raw"
    shutil.copytree(raw, changed)
    with open(changed / "valid.txt", "a", encoding="utf-8") as f:
        f.write("\n = Extra = \n\n the green cat sat .\n")
    messages.clear()
    summary = pretraining.prepare_pretraining(str(changed), str(out), vocab_size=60, log=messages.append)
    assert not any("skipped" in m for m in messages)
    assert summary["documents"]["valid"]["documents"] == _expected_lines(raw / "valid.txt")[1] + 1
    assert _decoded_binary(out, "valid")[0] == _expected_lines(changed / "valid.txt")[0]


def test_test_txt_is_the_training_text_when_there_is_no_train_txt(tmp_path):
    _write_corpus(tmp_path, n_docs=(3, 2), names=("test.txt", "valid.txt"))
    files = pretraining.find_raw_files(str(tmp_path))
    assert files == {"train": str(tmp_path / "test.txt"), "valid": str(tmp_path / "valid.txt")}
    (tmp_path / "train.txt").write_text("x\n")
    assert pretraining.find_raw_files(str(tmp_path))["train"] == str(tmp_path / "train.txt")
    assert pretraining.find_raw_files(str(tmp_path), train_file="test.txt")["train"] == str(tmp_path / "test.txt")


@pytest.mark.parametrize("problem, message", [
    ("missing", r"no valid text \(looked for valid.txt"),
    ("empty", r"valid.txt has no text"),
    ("headings_only", r"valid.txt has no text"),
    ("not_utf8", r"valid.txt is not valid UTF-8 \(1 line"),
])
def test_bad_input_is_one_clear_error(tmp_path, problem, message):
    (tmp_path / "train.txt").write_text("Some text .\n")
    valid = tmp_path / "valid.txt"
    if problem == "empty":
        valid.write_text("")
    elif problem == "headings_only":
        valid.write_text(" = Title = \n\n = = Section = = \n")
    elif problem == "not_utf8":
        valid.write_bytes(b"good line\n bad \xff\xfe line\n")
    with pytest.raises(DataError, match=message):
        pretraining.prepare_pretraining(str(tmp_path), str(tmp_path / "out"), vocab_size=60, log=lambda m: None)


def test_script_reports_errors_in_one_line(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"\xff\xfe\n")
    (tmp_path / "valid.txt").write_text("fine\n")
    proc = script("--raw-dir", tmp_path, "--out", tmp_path / "o")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"prepare_pretraining_data.py: error: {tmp_path / 'train.txt'} is not valid UTF-8 (1 line with invalid bytes)")
    assert "Traceback" not in proc.stderr
    missing = script("--raw-dir", tmp_path / "nope", "--out", tmp_path / "o2")
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"prepare_pretraining_data.py: error: --raw-dir {tmp_path / 'nope'} is not a directory: give a folder of "
        "raw text holding train.txt or wiki.train.tokens and valid.txt or wiki.valid.tokens (WikiText-2's archive "
        "has the wiki.*.tokens files)")
    assert not (tmp_path / "o2").exists()
    # the script itself, as a user runs it, in its own process
    assert "--vocab-size" in subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                                            text=True, timeout=60).stdout


@pytest.mark.slow  # 10-20 s under load: full suite only
def test_prepared_wikitext2_documents_and_splits(tmp_path_factory):
    out = prepared_wikitext2(tmp_path_factory)
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["settings"]["raw_files"] == {"train": str(WIKITEXT2 / "test.txt"),
                                                "valid": str(WIKITEXT2 / "valid.txt")}
    assert summary["documents"]["train"]["documents"] == _raw_title_count(WIKITEXT2 / "test.txt")
    assert summary["documents"]["valid"]["documents"] == _raw_title_count(WIKITEXT2 / "valid.txt")
    for name in ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "spm.model"):
        assert (out / name).exists()


# --------------------------------------------------------------------------------------
# Sentence pairs for next-sentence prediction
# --------------------------------------------------------------------------------------

def _synthetic_lines(seed=0, docs=12):
    """Lines as fairseq binarizes them (text, then EOS = 2) whose text tokens are their
    position in the flat stream of text (+100), so where a token came from can be read
    off it; EOS-only lines (empty lines of the raw text) separate documents. Returns
    (lines, sizes with EOS, token -> document)."""
    rng = random.Random(seed)
    text_sizes = []
    for d in range(docs):
        if d:
            text_sizes.append(0)
        text_sizes += [rng.choice([1, 2, 4, 7, 12, 29]) for _ in range(rng.randint(1, 9))]
    lines, pos = [], 0
    for size in text_sizes:
        lines.append(torch.cat([torch.arange(pos, pos + size) + 100, torch.tensor([2])]))
        pos += size
    doc_of = {}  # token -> document, from the line layout
    doc = 0
    for line in lines:
        if len(line) == 1:
            doc += 1
            continue
        for t in line[:-1].tolist():
            doc_of[t] = doc
    return lines, np.array(text_sizes) + 1, doc_of


def test_segments_cover_each_document_once_within_the_size():
    lines, sizes, doc_of = _synthetic_lines()
    sizes = sizes - 1  # build_segments counts text tokens
    segments, segment_doc = build_segments(sizes, 10)
    tokens = torch.cat([line[:-1] for line in lines])
    covered = torch.cat([tokens[a:b] for a, b in segments]).tolist()
    assert covered == tokens.tolist()  # every text token once, in order
    assert all(0 < b - a <= 10 for a, b in segments)
    line_starts = set(np.concatenate([[0], np.cumsum(sizes)]).tolist())
    for (a, b), doc in zip(segments, segment_doc):
        assert {doc_of[int(t)] for t in tokens[a:b]} == {doc}  # never across documents
        line = int(np.searchsorted(np.cumsum(sizes), a, side="right"))
        if sizes[line] <= 10:  # whole lines are kept whole
            assert a in line_starts
    assert len(document_spans(sizes)) == 12


def test_pairs_are_next_segments_or_segments_of_other_documents():
    lines, sizes, doc_of = _synthetic_lines(seed=1, docs=20)
    tokens_per_sample = 23
    pairs = NextSentencePairsDataset(lines, sizes, tokens_per_sample, seed=3)
    labels = NextSentenceLabelDataset(pairs)
    n_next = 0
    for epoch in (1, 2):
        pairs.set_epoch(epoch)
        in_a = []
        for i in range(len(pairs)):
            item = pairs[i].tolist()
            len_a, len_b, is_next = pairs.pair(i)
            in_a += item[:len_a]
            assert len(item) == len_a + len_b and 0 < len_a <= 10 and 0 < len_b <= 10
            assert len_a + len_b + 3 <= tokens_per_sample and pairs.num_tokens(i) <= tokens_per_sample
            a, b = item[:len_a], item[len_a:]
            assert a == list(range(a[0], a[0] + len_a))  # a contiguous span
            assert labels[i] == int(is_next)
            if is_next:
                n_next += 1
                assert doc_of[b[0]] == doc_of[a[0]] and b[0] == a[-1] + 1  # the very next tokens
            else:
                assert doc_of[b[0]] != doc_of[a[0]]
        assert len(in_a) == len(set(in_a))  # segments are taken two by two: no token is in two A's
    n = 2 * len(pairs)
    assert abs(n_next / n - 0.5) < 4 * (0.25 / n) ** 0.5  # balanced (4 sigma)


def test_pairs_are_fixed_per_epoch_and_redrawn_across_epochs():
    lines, sizes, _ = _synthetic_lines(seed=2, docs=20)
    pairs = NextSentencePairsDataset(lines, sizes, 23, seed=3)
    again = NextSentencePairsDataset(lines, sizes, 23, seed=3)
    draws = []
    for epoch in (1, 2):
        pairs.set_epoch(epoch)
        again.set_epoch(epoch)
        draws.append([pairs[i].tolist() for i in range(len(pairs))])
        assert draws[-1] == [again[i].tolist() for i in range(len(again))]
    assert draws[0] != draws[1]


def test_nsp_needs_two_documents():
    lines = [torch.arange(5) + 10, torch.arange(7) + 20]
    with pytest.raises(DataError, match="at least 2 documents"):
        NextSentencePairsDataset(lines, np.array([5, 7]), 16)


def test_task_batches_lay_out_pairs_and_mask_like_bert(tmp_path_factory):
    out = prepared_wikitext2(tmp_path_factory)
    task = MaskedLMNextSentenceTask.setup_task(MaskedLMNSPConfig(data=str(out), tokens_per_sample=64, seed=1))
    task.load_dataset("valid")
    dataset = task.datasets["valid"]
    pairs = dataset.dataset.defn["nsp_target"].pairs
    d = task.source_dictionary
    sample = dataset.collater([dataset[i] for i in range(400)])
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    assert src.size(1) <= 64
    counts = {"content": 0, "selected": 0, "mask": 0, "kept": 0}
    for row, i in enumerate(sample["id"].tolist()):
        len_a, len_b, is_next = pairs.pair(i)
        assert sample["nsp_target"][row] == int(is_next)
        end = len_a + len_b + 3
        assert src[row, 0] == d.bos() and src[row, 1 + len_a] == d.eos() and src[row, end - 1] == d.eos()
        assert (src[row, end:] == d.pad()).all()
        special = torch.zeros(src.size(1), dtype=torch.bool)
        special[[0, 1 + len_a, end - 1]] = True
        assert (tgt[row, special] == d.pad()).all()  # special tokens are never predicted
        selected = tgt[row].ne(d.pad())
        counts["content"] += len_a + len_b
        counts["selected"] += int(selected.sum())
        counts["mask"] += int((src[row, selected] == task.mask_idx).sum())
        counts["kept"] += int((src[row, selected] == tgt[row, selected]).sum())
    assert abs(counts["selected"] / counts["content"] - 0.15) < 0.01
    assert abs(counts["mask"] / counts["selected"] - 0.8) < 0.03  # BERT's 80/10/10
    assert abs(counts["kept"] / counts["selected"] - 0.1) < 0.03
    labels = sample["nsp_target"].float().mean().item()
    assert 0.4 < labels < 0.6


def _pieces_missing_from(out):
    """SentencePiece pieces (not control or unknown) that ``out/dict.txt`` lacks; WikiText's
    literal ``<unk>`` (a user-defined piece) is fairseq's own ``<unk>``, never a dict.txt line."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    symbols = {line.split(" ")[0] for line in (out / "dict.txt").read_text(encoding="utf-8").splitlines()}
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in symbols | {"<unk>"}]


@pytest.mark.slow  # two preparations: 15 s idle, minutes under load
def test_script_lists_every_piece_by_default_and_the_train_texts_with_no_full_vocabulary(small_corpus, tmp_path):
    """The command's default is the exportable dictionary (docs/bert.md#pre-training-data);
    --no-full-vocabulary is fairseq-preprocess's dictionary of the train text, the library's
    default (small_corpus), byte for byte, with the same binaries."""
    raw, library, _ = small_corpus
    assert _pieces_missing_from(library)  # the train text leaves pieces out: the case that matters
    for flags, out in (([], tmp_path / "full"), (["--no-full-vocabulary"], tmp_path / "train_only")):
        proc = script("--raw-dir", raw, "--out", out, "--vocab-size", "60", *flags)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["settings"].get("full_vocabulary", False) is not bool(flags)
        assert (out / "train.bin").read_bytes() == (library / "train.bin").read_bytes()
    assert not _pieces_missing_from(tmp_path / "full")
    assert (tmp_path / "train_only" / "dict.txt").read_bytes() == (library / "dict.txt").read_bytes()
