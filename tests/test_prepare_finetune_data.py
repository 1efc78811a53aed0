"""scripts/prepare_finetune_data.py (docs/bert.md#fine-tuning): a labelled TSV becomes a data
dir that fairseq's own sentence_prediction task reads back to the same pieces (encoded here
with SentencePiece directly) and labels; bad input is one line naming file and line."""

import subprocess
import sys

import pytest
import torch
from conftest import REPO, cli_env

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
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), *flags], capture_output=True,
                          text=True, env=cli_env(), timeout=300)


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
    proc = subprocess.run([sys.executable, str(SCRIPT), "--pretrained-data", str(root), "--train",
                           str(tmp_path / "nope.tsv"), "--valid", str(tmp_path / "nope.tsv"), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope.tsv: no such file" in proc.stderr
