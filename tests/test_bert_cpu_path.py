"""The BERT path as documented (docs/bert.md, README): the data every prepare command makes
exports, every pre-training and fine-tuning command names its --save-dir, and the short
offline CPU path (docs/bert.md#pre-train-fine-tune-and-evaluate-on-a-cpu-offline) is one
chain: its commands, read from the page and shrunk (tiny dims, a few updates, the first
captions), run one after the other and give a model that scripts/export_hf.py exports."""

import gzip
import json
import re
import subprocess
import sys

import pytest
from conftest import MULTI30K, REPO, SHARED_DATA, USER_DIR, WIKITEXT2, cli_env, require_shared_data
from inprocess import run_in_process
from test_docs import (
    FAIRSEQ_TOOLS,
    LAUNCHERS,
    bash_commands,
    commands,
    invocation,
    logical_lines,
    section,
    split_markdown,
)

from realformer_tools.cli import prepare_pretraining_data

CPU_PATH = "Pre-train, fine-tune and evaluate on a CPU (offline)"


def path_blocks():
    blocks, _ = split_markdown(section("docs/bert.md", CPU_PATH))
    return [code for lang, _, code in blocks if lang == "bash"]


def path_commands():
    """The commands of the short CPU path, in the page's order: ``[(words, text)]``."""
    return [(words, text) for code in path_blocks() for words, text in commands(code) if words]


def path_exports():
    """The variables the CPU path exports (``export NAME=value`` lines), for its commands."""
    return dict(re.findall(r"^export (\w+)=(\S+)", "\n".join(path_blocks()), flags=re.M))


def path_launches():
    """Per fairseq command of the CPU path, in the page's order, what its line runs it through:
    the words before the fairseq command (``[]``: fairseq's own command, no fixes)."""
    out = []
    for code in path_blocks():
        for line in logical_lines(code):
            words = line.split()
            at = next((i for i, w in enumerate(words) if w in FAIRSEQ_TOOLS), None)
            if at is not None and not line.lstrip().startswith("#"):
                out.append(words[:at])
    return out


def value(words, flag):
    assert flag in words, f"{flag} missing from: {' '.join(words)}"
    return words[words.index(flag) + 1]


def test_every_documented_prepare_command_makes_data_that_exports():
    """dict.txt lists every SentencePiece piece (what the export needs) unless a command
    says --no-full-vocabulary, which only the reproduction of committed results does."""
    found = 0
    for page, line, words, text in bash_commands():
        if not (words and (call := invocation(words)) and call[:2] == ("script", "prepare_pretraining_data")):
            continue
        found += 1
        args = prepare_pretraining_data.parse_args(call[2])
        if "--no-full-vocabulary" in call[2]:
            assert page.name == "results.md", f"{page.name}:{line}: {text}"
        else:
            assert args.full_vocabulary, f"{page.name}:{line}: {text}"
    assert found >= 3  # README, bert.md's data section and its CPU path


def test_every_documented_bert_training_names_its_save_dir():
    """No pre-training or fine-tuning fairseq-train of the README or docs/ leaves its
    checkpoints in fairseq's default, a bare checkpoints/."""
    found = 0
    for page, line, words, text in bash_commands():
        if words and words[0] == "fairseq-train" and any(
                w.startswith(("masked_lm", "sentence_prediction")) for w in words):
            found += 1
            save_dir = value(words, "--save-dir")
            assert save_dir.rstrip("/") != "checkpoints", f"{page.name}:{line}: {text}"
    assert found >= 7


def test_cpu_path_is_one_chain():
    """Each command reads what the one before wrote: data dirs, checkpoints, dims."""
    cmds = [words for words, _ in path_commands()]
    names = [invocation(w)[1] if invocation(w) else w[0] for w in cmds]
    assert names == ["prepare_pretraining_data", "fairseq-train", "prepare_finetune_data", "fairseq-train",
                     "fairseq-validate"]
    prepare, pretrain, finetune_data, finetune, evaluate = cmds
    data = value(prepare, "--out")
    assert "--no-full-vocabulary" not in prepare and pretrain[1] == data
    assert value(finetune_data, "--pretrained-data") == data
    assert finetune[1] == evaluate[1] == value(finetune_data, "--out")
    assert value(finetune, "--restore-file") == value(pretrain, "--save-dir") + "/checkpoint_best.pt"
    assert value(evaluate, "--path") == value(finetune, "--save-dir") + "/checkpoint_best.pt"
    for flag in ("--arch", "--encoder-layers", "--encoder-embed-dim", "--encoder-ffn-embed-dim",
                 "--encoder-attention-heads"):
        assert value(pretrain, flag) == value(finetune, flag), flag
    assert "test" in value(evaluate, "--valid-subset").split(",")
    # what the page's timings were measured with; every fairseq command through the launcher, whose
    # fixes to fairseq load the checkpoints under torch >= 2.6 (the data fixes not needed: no workers)
    assert path_exports() == {"OMP_NUM_THREADS": "1"}
    assert path_launches() == [list(LAUNCHERS)] * 3


# --------------------------------------------------------------------------------------
# Running it, shrunk
# --------------------------------------------------------------------------------------

TINY = {"--encoder-layers": 2, "--encoder-embed-dim": 32, "--encoder-ffn-embed-dim": 64,
        "--encoder-attention-heads": 4}
SHORT = {"--max-update": 8, "--total-num-update": 8, "--warmup-updates": 2, "--log-interval": 2}


def shrunk(words, tmp, **flags):
    """``words`` with paths made absolute (outputs under ``tmp``) and the values of
    ``flags`` ({"--flag": value}) replaced, or appended when the command lacks the flag; the
    corpora the docs read from ``../shared/data`` are this workspace's copy."""
    require_shared_data(SHARED_DATA)
    out = []
    for w in words:
        if w == "realformer_nmt":
            w = USER_DIR
        elif w.startswith("../shared/data/"):
            w = str(SHARED_DATA / w[len("../shared/data/"):])
        elif w.startswith(("data-bin/", "checkpoints/")):
            w = str(tmp / w)
        out.append(w)
    for flag, v in flags.items():
        if flag in out:
            out[out.index(flag) + 1] = str(v)
        else:
            out += [flag, str(v)]
    return out


def run(words, tmp):
    """A command of the page, from ``tmp`` with the page's exports: a script in a process of its
    own (``python scripts/<name>.py``, as the page runs it); a fairseq command through the launcher,
    as the page runs each one (test_cpu_path_is_one_chain), in this process (the launcher's main,
    tests/inprocess.py: stdout, stderr and exit status as a process of its own gives them)."""
    call = invocation(words)
    if not (call and call[0] == "script"):
        proc = run_in_process(words[0], *words[1:], check=False, cwd=tmp, env=path_exports())
        assert proc.returncode == 0, f"{' '.join(words)}\nfailed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        return proc
    argv = [sys.executable, str(REPO / "scripts" / f"{call[1]}.py"), *call[2]]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**cli_env(), **path_exports()}, timeout=600,
                          cwd=tmp)
    assert proc.returncode == 0, f"{' '.join(argv)}\nfailed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def first_captions(dest, n=200):
    """The first ``n`` English captions of each shared Multi30k split (real text, few)."""
    require_shared_data(MULTI30K)
    dest.mkdir()
    for name in ("train", "val", "test_2016_flickr"):
        with gzip.open(MULTI30K / f"{name}.en.gz", "rt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(n)]
        (dest / f"{name}.en").write_text("".join(lines), encoding="utf-8")
    return dest


@pytest.mark.slow
def test_cpu_path_runs_end_to_end_and_its_model_exports(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
    require_shared_data(WIKITEXT2, MULTI30K)
    from bert_helpers import TEST_VOCAB

    prepare, pretrain, finetune_data, finetune, evaluate = [words for words, _ in path_commands()]
    run(shrunk(prepare, tmp_path, **{"--vocab-size": TEST_VOCAB}), tmp_path)
    run(shrunk(pretrain, tmp_path, **TINY, **SHORT, **{"--max-valid-steps": 2}), tmp_path)
    summary = json.loads(run(shrunk(finetune_data, tmp_path, **{"--multi30k": first_captions(tmp_path / "m30k")}),
                             tmp_path).stdout)
    assert {split: n + summary["example"]["dropped_short"][split] for split, n in summary["lines"].items()} == {
        "train": 200, "valid": 200, "test": 200}
    run(shrunk(finetune, tmp_path, **TINY, **SHORT), tmp_path)
    proc = run(shrunk(evaluate, tmp_path), tmp_path)
    accuracy = dict(re.findall(r"valid on '(\w+)' subset \|.*\| accuracy ([\d.]+) ", proc.stdout + proc.stderr))
    assert set(accuracy) == {"valid", "test"}, proc.stderr[-2000:]
    assert all(0 <= float(a) <= 100 for a in accuracy.values())

    pretrained = shrunk([value(finetune, "--restore-file")], tmp_path)[0]
    assert pretrained.startswith(str(tmp_path)) and (tmp_path / value(pretrain, "--save-dir")).is_dir()
    assert (tmp_path / value(finetune, "--save-dir") / "checkpoint_best.pt").is_file()
    data = shrunk([value(prepare, "--out")], tmp_path)[0]
    export = subprocess.run([sys.executable, str(REPO / "scripts" / "export_hf.py"), pretrained,
                             "--out", str(tmp_path / "hf"), "--data", data],
                            capture_output=True, text=True, env=cli_env(), timeout=600)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "hf" / "config.json").is_file()
