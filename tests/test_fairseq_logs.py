"""The harness reads fairseq's ``--log-format json`` lines, and the ``simple`` lines of older
logs, into the same records; a recorded command's log format is not part of its recipe."""

import json
import math

import pytest
from conftest import REPO, USER_DIR
from inprocess import run_in_process

from realformer_tools.experiments import fairseq_logs, fairseq_runs, mlm_compare
from realformer_tools.experiments.translation import imports
from realformer_tools.experiments.translation.recipe import Recipe

# the same stats, as fairseq 0.12 logs them in each format (copied from two real runs)
JSON_LINES = [
    '2026-11-26 07:31:26 | INFO | valid | {"epoch": 1, "valid_loss": "5.33", "valid_nll_loss": "5.334", '
    '"valid_ppl": "40.33", "valid_wps": "0", "valid_wpb": "269", "valid_bsz": "40", "valid_num_updates": "2"}',
    '2026-11-26 07:31:26 | INFO | train | {"epoch": 1, "train_loss": "5.478", "train_nll_loss": "5.498", '
    '"train_num_updates": "2", "train_lr": "0.001", "train_train_wall": "2", "train_wall": "6"}',
    '2026-11-26 07:31:31 | INFO | train_inner | {"epoch": 3, "update": 2.5, "loss": "5.358", "nll_loss": "5.366", '
    '"ppl": "41.24", "wpb": "1237.6", "bsz": "185.6", "num_updates": "5", "lr": "0.001", "gnorm": "1.341"}',
    '2026-11-26 07:31:31 | INFO | valid | {"epoch": 3, "valid_loss": "4.979", "valid_nll_loss": "4.948", '
    '"valid_ppl": "30.88", "valid_wps": "0", "valid_wpb": "269", "valid_bsz": "40", "valid_num_updates": "6", '
    '"valid_best_loss": "4.979"}',
]
SIMPLE_LINES = [
    "2026-11-26 07:32:30 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.33 | nll_loss 5.334 "
    "| ppl 40.33 | wps 0 | wpb 269 | bsz 40 | num_updates 2",
    "2026-11-26 07:32:30 | INFO | train | epoch 001 | loss 5.478 | nll_loss 5.498 | num_updates 2 | lr 0.001 "
    "| train_wall 2 | wall 6",
    "2026-11-26 07:32:35 | INFO | train_inner | epoch 003:      1 / 2 loss=5.358, nll_loss=5.366, ppl=41.24, "
    "wpb=1237.6, bsz=185.6, num_updates=5, lr=0.001, gnorm=1.341",
    "2026-11-26 07:32:36 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 4.979 | nll_loss 4.948 "
    "| ppl 30.88 | wps 0 | wpb 269 | bsz 40 | num_updates 6 | best_loss 4.979",
]
EXPECTED = {
    "valid": [dict(loss=5.33, nll_loss=5.334, ppl=40.33, wps=0, wpb=269, bsz=40, num_updates=2, update=2),
              dict(loss=4.979, nll_loss=4.948, ppl=30.88, wps=0, wpb=269, bsz=40, num_updates=6, best_loss=4.979,
                   update=6)],
    "train": [dict(loss=5.358, nll_loss=5.366, ppl=41.24, wpb=1237.6, bsz=185.6, num_updates=5, lr=0.001,
                   gnorm=1.341, update=5)],
}


def test_json_and_simple_lines_give_the_same_records():
    assert fairseq_logs.parse_log(JSON_LINES) == EXPECTED
    assert fairseq_logs.parse_log(SIMPLE_LINES) == EXPECTED
    # a run started in simple format and resumed in json: one log holding both
    assert fairseq_logs.parse_log(SIMPLE_LINES[:2] + JSON_LINES[2:]) == EXPECTED
    assert fairseq_logs.valid_curve(JSON_LINES) == [[2, 5.33], [6, 4.979]]
    # the end of an epoch: fairseq prefixes its fields with "train_" in json (read, not in parse_log)
    assert fairseq_logs.stats_record(JSON_LINES[1]) == (
        "train", dict(loss=5.478, nll_loss=5.498, num_updates=2, lr=0.001, train_wall=2, wall=6))
    for line in ("2026-11-26 07:31:26 | INFO | fairseq_cli.train | {'_name': None}", "no log line", ""):
        assert fairseq_logs.stats_record(line) is None


def test_non_finite_losses_in_json_mark_divergence():
    nan = JSON_LINES + ['2026-11-26 07:31:40 | INFO | train_inner | {"epoch": 4, "loss": "nan", "num_updates": "8"}']
    assert fairseq_logs.divergence_reason(JSON_LINES) is None
    assert fairseq_logs.divergence_reason(nan) == "non-finite train loss at update 8"
    inf = JSON_LINES + ['2026-11-26 07:31:40 | INFO | valid | {"valid_loss": "inf", "valid_num_updates": "8"}']
    assert fairseq_logs.divergence_reason(inf) == "non-finite valid loss at update 8"
    assert math.isnan(fairseq_logs.parse_log(nan)["train"][-1]["loss"])


def test_validate_record_reads_the_summary_of_either_format():
    # fairseq-validate: per-batch lines (logger fairseq.logging.progress_bar), then the summary
    json_lines = ['2026-11-26 07:33:35 | INFO | fairseq.logging.progress_bar | {"loss": 132.9, "ntokens": "46"}',
                  '2026-11-26 07:33:37 | INFO | valid | {"valid_loss": "4.267", "valid_mlm_accuracy": "12.5", '
                  '"valid_wpb": "249", "valid_bsz": "40"}']
    simple_lines = ["2026-11-26 07:34:07 | INFO | fairseq.logging.progress_bar | valid on 'valid' subset:      "
                    "4 / 4 loss=196.1, ntokens=67",
                    "2026-11-26 07:34:07 | INFO | valid | valid on 'valid' subset | loss 4.267 | mlm_accuracy 12.5 "
                    "| wpb 249 | bsz 40"]
    expected = dict(loss=4.267, mlm_accuracy=12.5, wpb=249, bsz=40)
    assert fairseq_logs.validate_record(json_lines) == fairseq_logs.validate_record(simple_lines) == expected
    assert fairseq_logs.validate_record(json_lines[:1]) is None


def test_the_log_format_is_not_part_of_a_recipe():
    """Committed runs were logged in ``simple`` format; the harness now logs ``json``: the
    same run for resuming, reusing and importing."""
    committed = json.loads((REPO / "results" / "multi30k_en_de.json").read_text())["recipe"]["example_train_command"]
    at = committed.split().index("--log-format") + 1
    recorded, now = ([*committed.split()[:at], fmt, *committed.split()[at + 1:]] for fmt in ("simple", "json"))
    assert fairseq_runs.same_recipe(recorded, now)
    assert imports._normalized(recorded) == imports._normalized(now)
    lr = now.index("--lr") + 1
    other = [*now[:lr], str(float(now[lr]) * 2), *now[lr + 1:]]
    assert not fairseq_runs.same_recipe(recorded, other)
    assert imports._normalized(recorded) != imports._normalized(other)
    # what the harness passes now
    mlm = mlm_compare.MLMRecipe()
    for flags in (Recipe().train_flags(), mlm.train_flags(), mlm.validate_flags()):
        assert flags[flags.index("--log-format") + 1] == "json"


@pytest.mark.slow
def test_real_fairseq_logs_read_alike_in_both_formats(data_bin, tmp_path):
    """The same tiny fairseq-train run logged in json and in simple format: the same records,
    timings aside."""
    flags = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
             "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3",
             "--max-tokens", "2000", "--cpu", "--log-interval", "2", "--no-epoch-checkpoints", "--seed", "1",
             "--max-update", "6", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--user-dir", USER_DIR]
    parsed = {}
    for fmt in ("json", "simple"):
        # fairseq-train alone, in this process (tests/inprocess.py: its stdout and stderr as a subprocess gives them)
        proc = run_in_process("fairseq-train", data_bin, *flags, "--log-format", fmt, "--save-dir", tmp_path / fmt,
                              fixes=False)
        parsed[fmt] = fairseq_logs.parse_log((proc.stdout + proc.stderr).splitlines())
    timing = ("wps", "ups", "wall", "train_wall")

    def untimed(records):
        return [{k: v for k, v in rec.items() if k not in timing} for rec in records]
    for kind in ("valid", "train"):
        assert parsed["json"][kind] and untimed(parsed["json"][kind]) == untimed(parsed["simple"][kind])
    assert parsed["json"]["valid"][-1]["update"] == 6


def test_a_rerun_says_whether_it_resumes_or_restarts(tmp_path):
    """An unfinished attempt with a checkpoint resumes; one killed before its first checkpoint
    starts again from update 0, and the message says which."""
    import sys
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", "print(" + repr(JSON_LINES[3]) + ")", "--save-dir", str(run_dir)]

    def rerun():
        (run_dir / "train.json").unlink(missing_ok=True)
        messages = []
        record = fairseq_runs.train_resumable(cmd, str(run_dir), log=messages.append)
        return record, messages

    record, messages = rerun()
    assert record["attempts"] == 1 and not any("resuming" in m or "restarting" in m for m in messages)
    record, messages = rerun()
    assert record["attempts"] == 2 and any("restarting from update 0" in m for m in messages)
    (run_dir / "checkpoint_last.pt").write_bytes(b"")
    record, messages = rerun()
    assert record["attempts"] == 3 and any("resuming (fairseq continues from checkpoint_last.pt)" in m
                                           for m in messages)
    assert record["curve"][-1]["update"] == 6


def test_each_attempt_records_what_decides_its_float_rounding(tmp_path):
    """CPU model, torch's CPU capability and threads: the things besides the command that change
    a run's last bits. A run resumed under other settings names both; a repeated one, once."""
    import os
    import sys
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", "print(" + repr(JSON_LINES[3]) + ")", "--save-dir", str(run_dir)]

    def attempt(**env):
        (run_dir / "train.json").unlink(missing_ok=True)
        return fairseq_runs.train_resumable(cmd, str(run_dir), log=lambda m: None, env=dict(os.environ, **env))

    first = attempt(OMP_NUM_THREADS="3", ATEN_CPU_CAPABILITY="default")
    (machine,) = first["machines"]
    assert machine["threads"] == 3 and machine["cpu_capability"] == "default"
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    again = attempt(OMP_NUM_THREADS="3", ATEN_CPU_CAPABILITY="default")
    assert again["attempts"] == 2 and again["machines"] == [machine]
    other = attempt(OMP_NUM_THREADS="1")
    assert other["machines"][0] == machine and other["machines"][1]["threads"] == 1
    assert other["machines"][1]["cpu_capability"] not in ("", None)
    recorded = json.loads((run_dir / "attempts.json").read_text())
    assert [a["machine"]["threads"] for a in recorded] == [3, 3, 1]
