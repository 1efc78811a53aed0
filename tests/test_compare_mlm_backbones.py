"""The masked-LM backbone comparison (issue 10, item 8) on the real WikiText-2 text (its first lines):
well-formed results, identical recipes except the backbone flags, MLM accuracy equal to
fairseq-validate's own count, reuse of finished runs."""

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
from bert_helpers import prepared_wikitext2
from conftest import REPO, USER_DIR, cli_env
from fairseq.data import Dictionary, data_utils

from realformer_tools.experiments import mlm_compare


def tiny_recipe(**overrides):
    settings = dict(layers=1, embed_dim=32, ffn_dim=64, heads=2, tokens_per_sample=32, batch_size=8,
                    warmup_updates=2, max_update=6, validate_interval_updates=3, max_valid_steps=2,
                    validate_batch_size=512)
    settings.update(overrides)
    return mlm_compare.MLMRecipe(**settings)


# lines of each split of the prepared WikiText-2 that the comparison reads (measured: 879 train and 820
# valid blocks of 31 pieces): the recipe's 6 updates of 8 blocks within one epoch, its validation subset
# and two fairseq-validate batches; all of valid (500k pieces) made every backbone's fairseq-train
# (building its validation iterator) and fairseq-validate read all of it
SLICE_LINES = {"train": 100, "valid": 100}


@pytest.fixture(scope="module")
def wikitext2(tmp_path_factory):
    """The first ``SLICE_LINES`` of the session's prepared WikiText-2 (``prepared_wikitext2``): its
    dictionary and binarized real text, item by item as fairseq reads them (nothing re-encoded)."""
    from fairseq.data import indexed_dataset

    full = prepared_wikitext2(tmp_path_factory)
    dest = tmp_path_factory.mktemp("wikitext2_slice")
    shutil.copyfile(full / "dict.txt", dest / "dict.txt")
    dictionary = Dictionary.load(str(full / "dict.txt"))
    for split, lines in SLICE_LINES.items():
        impl = indexed_dataset.infer_dataset_impl(str(full / split))
        dataset = data_utils.load_indexed_dataset(str(full / split), dictionary, impl)
        assert len(dataset) > lines
        builder = indexed_dataset.make_builder(str(dest / f"{split}.bin"), impl, vocab_size=len(dictionary))
        for i in range(lines):
            builder.add_item(dataset[i])
        builder.finalize(str(dest / f"{split}.idx"))
    return dest


def validate_summary(log_text):
    """The numbers of fairseq-validate's summary line, logged with ``--log-format json``
    (``| INFO | valid | {"valid_loss": "7.9", ...}``)."""
    lines = [line for line in log_text.splitlines() if "| INFO | valid | {" in line]
    assert len(lines) == 1, lines
    return {k[len("valid_"):]: float(v) for k, v in json.loads(lines[0].split(" | ", 3)[3]).items()}


def whole_validation_set(data, tokens_per_sample):
    """(blocks, tokens) of the masked-LM validation set as fairseq's masked_lm task makes it
    from ``valid.bin`` (default ``--sample-break-mode none``): the text in one stream, cut
    into blocks of ``tokens_per_sample - 1`` pieces, each with ``<s>`` in front."""
    dataset = data_utils.load_indexed_dataset(str(data / "valid"), Dictionary.load(str(data / "dict.txt")))
    pieces = int(np.array(dataset.sizes).sum())
    blocks = -(-pieces // (tokens_per_sample - 1))
    return blocks, pieces + blocks


@pytest.mark.slow
def test_mlm_comparison_writes_results_then_reuses_finished_runs(wikitext2, tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results" / "mlm.json"
    messages = []
    mlm_compare.compare(str(wikitext2), str(out), tiny_recipe(), results_path=str(results), threads=1,
                        log=messages.append, jobs=2)
    data = json.loads(results.read_text())  # strict JSON
    shared = {}
    for backbone in mlm_compare.BACKBONES:
        entry = data[backbone]
        assert 0 <= entry["mlm_accuracy"] <= 100 and entry["mlm_accuracy_per_seed"] == [entry["mlm_accuracy"]]
        assert entry["updates"] == 6 and entry["seeds"] == [1]
        assert [u for u, _ in entry["curve"]] == [3, 6]
        assert all(math.isfinite(v) for _, v in entry["curve"] + entry["loss_curve"])
        run = json.loads((out / backbone / "seed1" / "result.json").read_text())
        # the reported accuracy is the one fairseq-validate printed, counted over the whole
        # validation set (fairseq-validate sums its batches: bsz / wpb are the totals)
        full = run["full_valid"]
        printed = validate_summary((out / backbone / "seed1" / "validate.log").read_text())
        assert entry["mlm_accuracy"] == pytest.approx(printed["mlm_accuracy"], abs=1e-9)
        assert (printed["bsz"], printed["wpb"]) == whole_validation_set(wikitext2, tiny_recipe().tokens_per_sample)
        assert "--max-valid-steps" not in full["command"]
        cmd = run["command"]
        assert cmd[cmd.index("--user-dir") + 1] == USER_DIR
        del cmd[cmd.index("--save-dir"):cmd.index("--save-dir") + 2]
        flags = mlm_compare.backbone_flags(backbone)
        start = cmd.index(flags[0])
        shared[backbone] = cmd[:start] + cmd[start + len(flags):]
    assert shared["postln"] == shared["preln"] == shared["realformer"]
    assert "--max-positions" in shared["postln"]  # identical position tables, identical init
    assert results.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| realformer |" in results.with_suffix(".md").read_text()

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".pt", ".log")}
    messages.clear()
    mlm_compare.compare(str(wikitext2), str(out), tiny_recipe(), results_path=str(results), threads=1,
                        log=messages.append)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert sum("already done" in m for m in messages) == 3


@pytest.mark.slow
def test_cli_help_and_one_line_errors(tmp_path, capsys):
    """--help names every option (the script's parse_args, in this process); a folder that is no
    prepared data is one line from the script started as a user starts it."""
    from realformer_tools.cli import compare_mlm_backbones as cli

    script = str(REPO / "scripts" / "compare_mlm_backbones.py")
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert exit_.value.code == 0
    for flag in ("--data", "--max-update", "--seeds", "--backbones", "--objective", "--device", "--results"):
        assert flag in help_text
    proc = subprocess.run([sys.executable, script, "--data", str(tmp_path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("prepare it with scripts/prepare_pretraining_data.py")
    with pytest.raises(Exception, match="--objective"):
        mlm_compare.MLMRecipe(objective="nsp")
