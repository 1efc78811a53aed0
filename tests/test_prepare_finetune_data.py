"""scripts/prepare_finetune_data.py (docs/bert.md#fine-tuning): a labelled TSV becomes a data
dir that fairseq's own sentence_prediction task reads back to the same pieces (encoded here
with SentencePiece directly) and labels; bad input is one line naming file and line."""

import subprocess
import sys

import pytest
import torch
from conftest import MULTI30K, REPO, cli_env, require_shared_data
from inprocess import run_in_process

SCRIPT = REPO / "scripts" / "prepare_finetune_data.py"
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song",
             "a fish swam in the lake", "the cat saw the dog", "a bird flew over the park"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A stand-in for prepare_pretraining_data.py's output: spm.model and a dict.txt of its pieces."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("pretrained")
    text = root / "text.txt"
    text.write_text("\n".join(SENTENCES * 5) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(root / "spm"), vocab_size=40,
                                   model_type="bpe", bos_id=-1, eos_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i)]
    (root / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces if p != "<unk>"))
    return root, sp


def prepare(tmp_path, pretrained_dir, files, *flags):
    paths = {}
    for split, lines in files.items():
        paths[split] = tmp_path / f"{split}.tsv"
        paths[split].write_text("\n".join(lines) + "\n")
    args = ["--pretrained-data", pretrained_dir, "--out", tmp_path / "out"]
    for split, path in paths.items():
        args += [f"--{split}", path]
    return script(*args, *flags)


def script(*args):
    """The script's main in this process (tests/inprocess.py: stdout, stderr and exit status as a
    subprocess gives them); run_multi30k runs the script itself, in its own process."""
    return run_in_process("realformer-prepare-finetune-data", *args, check=False, fixes=False, argv0=SCRIPT)


def load(out, split, **cfg):
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
    from omegaconf import OmegaConf

    fields = dict(data=str(out), init_token=0, separator_token=2, regression_target=False, seed=1,
                  classification_head_name="sentence_classification_head")
    config = OmegaConf.structured(SentencePredictionConfig(**dict(fields, **cfg)))
    task = SentencePredictionTask.setup_task(config)
    task.load_dataset(split)
    return task, task.dataset(split)


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
def test_classification_data_reads_back_through_fairseqs_task(pretrained, tmp_path, pairs):
    root, sp = pretrained
    rows = [(SENTENCES[i], SENTENCES[-1 - i], "yes" if i % 2 else "no") for i in range(len(SENTENCES))]
    lines = ["\t".join(r if pairs else (r[0], r[2])) for r in rows]
    proc = prepare(tmp_path, root, {"train": ["sentence\tlabel"] + lines, "valid": lines[:3]}, "--skip-header")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"num_classes": 2' in proc.stdout and (tmp_path / "out" / ("input1" if pairs else "input0")).is_dir()
    assert (tmp_path / "out" / "input1").is_dir() == pairs

    task, dataset = load(tmp_path / "out", "train", num_classes=2, no_shuffle=True)
    dictionary = task.source_dictionary
    assert len(dataset) == len(rows)
    for i, (first, second, label) in enumerate(rows):
        sample = dataset[i]
        expected = [0] + [dictionary.index(p) for p in sp.encode(first, out_type=str)] + [2]
        if pairs:
            expected += [2] + [dictionary.index(p) for p in sp.encode(second, out_type=str)] + [2]
        assert sample["net_input.src_tokens"].tolist() == expected
        assert dictionary.unk() not in expected
        assert task.label_dictionary[int(sample["target"]) + task.label_dictionary.nspecial] == label


def test_regression_labels_are_numbers(pretrained, tmp_path):
    root, _ = pretrained
    lines = [f"{s}\t{i / 2}" for i, s in enumerate(SENTENCES)]
    proc = prepare(tmp_path, root, {"train": lines, "valid": lines[:2]}, "--regression")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, dataset = load(tmp_path / "out", "train", num_classes=1, regression_target=True, no_shuffle=True)
    targets = [float(torch.as_tensor(dataset[i]["target"]).flatten()[0]) for i in range(len(lines))]
    assert targets == [i / 2 for i in range(len(lines))]


@pytest.mark.parametrize("files,flags,words", [
    ({"train": ["one field only"], "valid": ["a\tb"]}, [], ["train.tsv:1", "1 tab-separated field"]),
    ({"train": ["a\tx", "b\tc\ty"], "valid": ["a\tx"]}, [], ["train.tsv", "number of sentences"]),
    ({"train": ["a\tx"], "valid": ["a\tz"]}, [], ["valid.tsv", "z", "never occur"]),
    ({"train": ["a\tbig"], "valid": ["a\t1"]}, ["--regression"], ["train.tsv:1", "'big'", "not a number"]),
], ids=["fields", "mixed-pairs", "unseen-label", "regression-label"])
def test_bad_input_is_one_line(pretrained, tmp_path, files, flags, words):
    root, _ = pretrained
    proc = prepare(tmp_path, root, files, *flags)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare_finetune_data.py: error: "), proc.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # refused before writing anything


def test_missing_files_are_one_line(pretrained, tmp_path):
    root, _ = pretrained
    proc = prepare(tmp_path, tmp_path, {"train": ["a\tx"], "valid": ["a\tx"]})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no dict.txt" in proc.stderr
    proc = script("--pretrained-data", root, "--train", tmp_path / "nope.tsv", "--valid", tmp_path / "nope.tsv",
                  "--out", tmp_path / "o")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope.tsv: no such file" in proc.stderr


# --------------------------------------------------------------------------------------
# --multi30k: the offline example task (word order on Multi30k's English captions), on
# the first captions of the shared copy
# --------------------------------------------------------------------------------------

CAPTION_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    """(raw dir with the first 300 / 60 / 60 English captions of the shared Multi30k, as
    .en.gz like the shared copy; a pre-training data dir whose spm.model and dict.txt cover
    them)."""
    import gzip

    import sentencepiece as spm

    require_shared_data(MULTI30K)
    root = tmp_path_factory.mktemp("captions")
    raw, pretrained = root / "multi30k", root / "pretrained"
    raw.mkdir()
    pretrained.mkdir()
    for split, name in CAPTION_FILES.items():
        with gzip.open(MULTI30K / f"{name}.en.gz", "rt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(300 if split == "train" else 60)]
        with gzip.open(raw / f"{name}.en.gz", "wt", encoding="utf-8") as f:
            f.writelines(lines)
    text = root / "text.txt"
    text.write_text("".join(gzip.open(raw / f"{n}.en.gz", "rt").read().lower() for n in CAPTION_FILES.values()))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(pretrained / "spm"), vocab_size=300,
                                   model_type="bpe", bos_id=-1, eos_id=-1, character_coverage=1.0,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(pretrained / "spm.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i)]
    (pretrained / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces if p != "<unk>"))
    return raw, pretrained, sp


def expected_captions(raw, split):
    """The captions of ``split`` as the task shows them, computed here from the raw file:
    lower case, without a final '.', only those of at least three words (two different)."""
    import gzip

    out = []
    for line in gzip.open(raw / f"{CAPTION_FILES[split]}.en.gz", "rt", encoding="utf-8"):
        words = line.lower().split()
        if words and words[-1].endswith("."):
            words[-1] = words[-1].rstrip(".")
            words = [w for w in words if w]
        if len(words) >= 3 and len(set(words)) > 1:
            out.append(words)
    return out


def run_multi30k(raw, pretrained, out, *flags):
    """The script as a user runs it, in its own process."""
    return subprocess.run([sys.executable, str(SCRIPT), "--pretrained-data", str(pretrained), "--multi30k",
                           str(raw), "--out", str(out), *map(str, flags)], capture_output=True, text=True,
                          env=cli_env(), timeout=300)


def tsv_rows(out, split):
    return [line.split("\t") for line in (out / "tsv" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow  # 10 s idle (fairseq-preprocess twice), minutes under load: full suite only
def test_multi30k_word_order_task_is_each_caption_as_written_or_shuffled(captions, tmp_path):
    import json

    raw, pretrained, sp = captions
    proc = run_multi30k(raw, pretrained, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["num_classes"] == 2 and summary["classes"] == ["original", "shuffled"]
    for split in CAPTION_FILES:
        words = expected_captions(raw, split)
        rows = tsv_rows(tmp_path / "out", split)
        assert len(rows) == len(words) == summary["lines"][split]
        labels = [label for _, label in rows]
        assert abs(labels.count("original") - labels.count("shuffled")) <= 1  # half each
        assert summary["example"]["labels"][split] == {"original": labels.count("original"),
                                                         "shuffled": labels.count("shuffled")}
        for (sentence, label), caption in zip(rows, words):
            shown = sentence.split()
            assert sorted(shown) == sorted(caption)  # the same words in both classes
            assert (shown == caption) == (label == "original"), (sentence, label, caption)

    # fairseq's own sentence_prediction task reads back the pieces and labels of the TSV
    task, dataset = load(tmp_path / "out", "valid", num_classes=2, no_shuffle=True)
    dictionary = task.source_dictionary
    for i, (sentence, label) in enumerate(tsv_rows(tmp_path / "out", "valid")):
        sample = dataset[i]
        expected = [0] + [dictionary.index(p) for p in sp.encode(sentence, out_type=str)] + [2]
        assert sample["net_input.src_tokens"].tolist() == expected
        assert dictionary.unk() not in expected
        assert task.label_dictionary[int(sample["target"]) + task.label_dictionary.nspecial] == label

    # the command wrote what the library draws; the same seed repeats it, another draws anew
    from realformer_tools.data import caption_order

    tables, _ = caption_order.word_order_task(str(raw), seed=1)
    assert {split: [list(r) for r in rows] for split, rows in tables.items()} == {
        split: tsv_rows(tmp_path / "out", split) for split in CAPTION_FILES}
    assert caption_order.word_order_task(str(raw), seed=1)[0] == tables
    assert caption_order.word_order_task(str(raw), seed=2)[0]["train"] != tables["train"]


@pytest.mark.parametrize("case,words", [
    ("with-train", ["--multi30k makes its own splits", "--train"]),
    ("neither", ["give --train and --valid", "--multi30k DIR"]),
    ("not-a-dir", ["--multi30k", "is not a directory"]),
    ("no-test-file", ["--multi30k", "test_2016_flickr.en"]),
])
def test_multi30k_bad_input_is_one_line(captions, tmp_path, case, words):
    raw, pretrained, _ = captions
    out = tmp_path / "out"
    base = ["--pretrained-data", pretrained, "--out", out]
    if case == "with-train":
        args = ["--multi30k", str(raw), "--train", str(tmp_path / "t.tsv")]
    elif case == "neither":
        args = []
    elif case == "not-a-dir":
        args = ["--multi30k", str(tmp_path / "nowhere")]
    else:
        partial = tmp_path / "partial"
        partial.mkdir()
        for name in ("train", "val"):
            (partial / f"{name}.en.gz").write_bytes((raw / f"{name}.en.gz").read_bytes())
        args = ["--multi30k", str(partial)]
    proc = script(*base, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare_finetune_data.py: error: "), proc.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert not out.exists()  # refused before writing anything
