"""The backbone comparison harness (scripts/compare_backbones.py,
realformer_tools/experiments/translation/ and fairseq_runs.py), through the real fairseq CLIs.

Tiny models and a few updates only: these prove the plumbing (JSON/MD/PNG, sacreBLEU
in corpus order, resume, divergence handling, --eval-bleu checkpoint selection), not
which backbone is better.
"""

import json
import math
import os
import random
import re
import subprocess
import sys
import time

import pytest
import sacrebleu
from conftest import MULTI30K, REPO, USER_DIR, cli_env, require_shared_data
from harness_helpers import TINY_SIZE, copy_data, raw_2017, tiny_recipe
from inprocess import run_in_process

from realformer_nmt.errors import ConfigError
from realformer_tools.data import pipeline
from realformer_tools.experiments import compare, fairseq_runs

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")

pytest_plugins = ("harness_fixtures",)  # m30k_slice, m30k_three_sets, tiny_comparison: once per session (per worker)


def __getattr__(name):
    """``from test_compare_backbones import m30k_slice`` (older test files) still finds the fixture; it
    is not bound here, or pytest would build it once more for this module."""
    if name == "m30k_slice":
        import harness_fixtures

        return harness_fixtures.m30k_slice
    raise AttributeError(name)


def _quiet(message):
    pass


# --------------------------------------------------------------------------------------
# The comparison, end to end
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_comparison_writes_results_then_reuses_finished_runs(m30k_slice, tiny_comparison):
    """The session's ``tiny_comparison`` (the three backbones, two trainings at once) is what the
    harness wrote; the same call again trains and decodes nothing; another recipe is refused."""
    out, results, summary, messages = tiny_comparison
    messages = list(messages)

    data = json.loads(results.read_text())  # strict JSON: no NaN
    refs = pipeline.read_lines(str(m30k_slice / "work" / "raw" / "test.de"))
    for backbone in ("postln", "preln", "realformer"):
        entry = data[backbone]
        assert math.isfinite(entry["bleu"]) and entry["bleu_per_seed"] == [entry["bleu"]]
        assert entry["seeds"] == [1] and entry["updates"] == 4
        assert entry["curve"] and entry["curve"][-1][0] == 4 and math.isfinite(entry["curve"][-1][1])
        assert entry["valid_loss"] == min(v for _, v in entry["curve"])
        # the stored BLEU is sacreBLEU of fairseq's hypotheses put back in corpus order
        run_dir = out / backbone / "seed1"
        hyps = {}
        for line in (run_dir / "generate.txt").read_text(encoding="utf-8").splitlines():
            if line.startswith("D-"):
                fields = line.split("\t")
                hyps[int(fields[0][2:])] = fields[2] if len(fields) > 2 else ""
        assert sorted(hyps) == list(range(len(refs)))
        expected = sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs])
        assert entry["bleu"] == pytest.approx(expected.score, abs=0.006)
        assert (run_dir / "checkpoint_best.pt").exists() and (run_dir / "train.log").exists()
    # only the backbone flags differ, and every run loaded the plugin
    shared = {}
    for b in compare.BACKBONES:
        cmd = json.loads((out / b / "seed1" / "result.json").read_text())["command"]
        assert cmd[cmd.index("--user-dir") + 1] == USER_DIR
        assert cmd[cmd.index("--save-dir") + 1] == str(out / b / "seed1")
        del cmd[cmd.index("--save-dir"):cmd.index("--save-dir") + 2]
        flags = compare.backbone_flags(b)
        start = cmd.index(flags[0])
        assert cmd[start:start + len(flags)] == flags
        shared[b] = cmd[:start] + cmd[start + len(flags):]
    assert shared["postln"] == shared["preln"] == shared["realformer"]
    commands = {b: json.loads((out / b / "seed1" / "result.json").read_text())["command"] for b in compare.BACKBONES}
    assert "realformer_transformer" in commands["realformer"] and "--encoder-normalize-before" in commands["preln"]
    assert data["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "--max-update 4" in " ".join(data["recipe"]["shared_train_flags"])
    assert results.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = results.with_suffix(".md").read_text()
    assert "| realformer |" in table and "one seed" in table
    assert any("finished 3/3" in m for m in messages)

    # the same call again: nothing is retrained or re-decoded
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".pt", ".log", ".txt")}
    messages.clear()
    again = compare.compare(str(m30k_slice), str(out), tiny_recipe(), results_path=str(results),
                            threads=1, log=messages.append)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert sum("already done" in m for m in messages) == 3
    assert again["realformer"]["bleu"] == summary["realformer"]["bleu"]

    # a different recipe in the same folder is refused, not mixed in
    with pytest.raises(fairseq_runs.RunError, match="different command"):
        compare.compare(str(m30k_slice), str(out), tiny_recipe(max_update=5), backbones=("postln",),
                        threads=1, log=_quiet)


# --------------------------------------------------------------------------------------
# The learning-rate sweep
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sweep_marks_nan_run_diverged_without_crashing(m30k_slice, tmp_path):
    out, results = tmp_path / "sweep", tmp_path / "lr_stress.json"
    summary = compare.lr_sweep(str(m30k_slice), str(out), tiny_recipe(), lrs=[1e-3, 1e30],
                               backbones=("realformer",), results_path=str(results), threads=1, log=_quiet)
    normal, absurd = summary["runs"]["realformer"]["0.001"][0], summary["runs"]["realformer"]["1e+30"][0]
    assert normal["outcome"] == "ok" and math.isfinite(normal["bleu"])
    assert absurd["outcome"] == "diverged" and "NaN/inf" in absurd["reason"] and absurd["bleu"] is None
    # fairseq really blew up: its own exception is in that run's log
    assert "FloatingPointError" in open(absurd["log"], encoding="utf-8").read()
    data = json.loads(results.read_text())
    assert data["normal_lr"] == 1e-3 and "lagging" in data["divergence_rule"]
    assert "diverged: BLEU n/a" in results.with_suffix(".md").read_text()  # no bold: bold marks differences only
    assert results.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # a re-run keeps the diverged outcome instead of training it again
    log_size = os.path.getsize(absurd["log"])
    again = compare.lr_sweep(str(m30k_slice), str(out), tiny_recipe(), lrs=[1e-3, 1e30],
                             backbones=("realformer",), results_path=str(results), threads=1, log=_quiet)
    assert again["runs"]["realformer"]["1e+30"][0]["outcome"] == "diverged"
    assert os.path.getsize(absurd["log"]) == log_size


def test_lagging_rule_compares_with_the_best_run_of_the_same_seed():
    run = dict(status="finished", best_valid_loss=7.5)
    assert compare.classify(run, reference_loss=6.0, margin=1.0) == "lagging"
    assert compare.classify(run, reference_loss=6.6, margin=1.0) == "ok"
    assert compare.classify(dict(run, status="diverged"), reference_loss=6.6, margin=1.0) == "diverged"
    assert compare.classify(dict(run, best_valid_loss=None), reference_loss=6.6, margin=1.0) == "diverged"


def test_sweep_outcomes_follow_the_rule_of_every_study():
    """The lr sweep's reference is the lowest best valid loss of its finished runs of the same
    seed (every backbone and lr), as in the depth test and the grids: Post-LN at 1e-2 is lagging
    at 7.9 because RealFormer reached 6.5 at 3e-3, though Post-LN's own 1e-3 run had 7.0; a
    diverged run (NaN) is no reference."""
    from realformer_tools.experiments.translation import lr_sweep

    def run(seed, loss, status="finished"):
        return {"seed": seed, "status": status, "best_valid_loss": loss, "outcome": None}

    table = {"postln": {"0.001": [run(1, 7.0), run(2, 7.2)], "0.01": [run(1, 7.9), run(2, 7.9)]},
             "realformer": {"0.001": [run(1, 6.9), run(2, 7.1)], "0.003": [run(1, 6.5), run(2, None, "diverged")]}}
    assert lr_sweep.classify_sweep(table, margin=1.0) == {1: 6.5, 2: 7.1}
    assert [e["outcome"] for e in table["postln"]["0.01"]] == ["lagging", "ok"]
    assert [e["outcome"] for e in table["postln"]["0.001"]] == ["ok", "ok"]
    assert [e["outcome"] for e in table["realformer"]["0.003"]] == ["ok", "diverged"]
    assert "every lr and backbone" in lr_sweep.sweep_reference(1e-3)


# --------------------------------------------------------------------------------------
# Reading fairseq's output
# --------------------------------------------------------------------------------------

def test_log_parsing_reads_validation_records_and_nan():
    lines = [
        "2026-01-01 00:00:00 | INFO | train_inner | epoch 001:     25 / 255 loss=12.976, nll_loss=12.899, "
        "ppl=7636.62, wps=351, ups=0.2, num_updates=25, lr=6.25e-05, gnorm=3.303, train_wall=123, wall=125",
        "2026-01-01 00:00:01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.123 | nll_loss 6.9 "
        "| ppl 139.2 | bleu 12.5 | wps 1234 | wpb 440 | bsz 13.3 | num_updates 255 | best_loss 7.123",
        "2026-01-01 00:00:02 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.5 | num_updates 510",
        # a resumed run repeats update 510: the later record wins
        "2026-01-01 00:00:03 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.4 | num_updates 510",
    ]
    parsed = fairseq_runs.parse_log(lines)
    assert parsed["train"][0]["update"] == 25 and parsed["train"][0]["loss"] == 12.976
    assert parsed["train"][0]["lr"] == 6.25e-05
    assert [(r["update"], r["loss"]) for r in parsed["valid"]] == [(255, 7.123), (510, 6.4)]
    assert fairseq_runs.valid_curve(lines, "bleu") == [[255, 12.5]]
    assert fairseq_runs.divergence_reason(lines) is None
    nan = lines + ["2026-01-01 00:00:04 | INFO | train_inner | epoch 003: 10 / 255 loss=nan, num_updates=530"]
    assert fairseq_runs.divergence_reason(nan) == "non-finite train loss at update 530"


def test_generate_output_is_put_back_in_corpus_order():
    lines = ["S-2\tc", "H-2\t-0.1\tC", "D-2\t-0.1\tdrei", "D-0\t-0.2\teins", "D-1\t-0.3\t", "P-1\t-0.3"]
    assert fairseq_runs.parse_generate_output(lines) == {0: "eins", 1: "", 2: "drei"}


def test_same_recipe_ignores_tool_path_and_user_dir_only():
    a = ["/x/bin/fairseq-train", "data", "--user-dir", "/work/main/realformer_nmt", "--lr", "0.001"]
    b = ["/y/bin/fairseq-train", "data", "--user-dir", "/frozen/realformer_nmt", "--lr", "0.001"]
    assert fairseq_runs.same_recipe(a, b)
    assert not fairseq_runs.same_recipe(a, b[:-1] + ["0.002"])


def test_recipe_refuses_bad_settings():
    with pytest.raises(ConfigError, match="--size"):
        compare.Recipe(size="huge")
    with pytest.raises(ConfigError, match="--fp16"):
        compare.Recipe(fp16=True)
    with pytest.raises(ConfigError, match="--backbones"):
        compare.backbone_flags("bert")
    gpu = compare.Recipe(device="cuda", size="iwslt")
    assert "--fp16" in gpu.train_flags() and "--cpu" not in gpu.train_flags()
    assert gpu.model_flags()[:8] == ["--encoder-layers", "6", "--encoder-embed-dim", "512",
                                     "--encoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4"]


@pytest.mark.slow
def test_cli_help_and_one_line_errors(tmp_path, capsys):
    """--help names every option (the script's parse_args, in this process); a refused data folder is
    one line from the script started as a user starts it."""
    from realformer_tools.cli import compare_backbones as cli

    script = str(REPO / "scripts" / "compare_backbones.py")
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert exit_.value.code == 0
    for flag in ("--lr-sweep", "--seeds", "--backbones", "--device", "--max-update", "--max-minutes",
                 "--residual-attention-mode", "--train-args", "--select-by-bleu", "--size"):
        assert flag in help_text
    proc = subprocess.run([sys.executable, script, "--data", str(tmp_path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=cli_env())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("compare_backbones.py: error:") and "dict.en.txt" in proc.stderr


# --------------------------------------------------------------------------------------
# fairseq's --eval-bleu with our architecture
# --------------------------------------------------------------------------------------

def _write_piece_corpus(raw, pieces):
    """A reversal task written as SentencePiece pieces: ``pieces`` gets ``{split}.{src,tgt}``
    with ``\u2581``-prefixed tokens, ``raw`` the detokenized target text."""
    rng = random.Random(0)
    for split, n in (("train", 600), ("valid", 40)):
        src, tgt, ref = [], [], []
        for _ in range(n):
            s = [rng.choice("abcdefghij") for _ in range(rng.randint(3, 7))]
            src.append(" ".join("\u2581" + c for c in s))
            t = [c.upper() for c in reversed(s)]
            tgt.append(" ".join("\u2581" + c for c in t))
            ref.append(" ".join(t))
        (pieces / f"{split}.src").write_text("\n".join(src) + "\n", encoding="utf-8")
        (pieces / f"{split}.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
        (raw / f"{split}.tgt").write_text("\n".join(ref) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_eval_bleu_selects_checkpoint_best_by_bleu(tmp_path):
    raw, pieces, data, save = (tmp_path / d for d in ("raw", "pieces", "bin", "ckpt"))
    for d in (raw, pieces):
        d.mkdir()
    _write_piece_corpus(raw, pieces)
    # the corpus binarized in this process (tests/inprocess.py): preparing it is not what is tested here
    run_in_process("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref",
                   pieces / "train", "--validpref", pieces / "valid", "--destdir", data, "--joined-dictionary",
                   "--workers", "1", fixes=False)
    # fairseq-train through the launcher with the data fixes, in this process (tests/inprocess.py)
    proc = run_in_process(
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        *compare.Recipe(**TINY_SIZE).model_flags(), "--optimizer", "adam", "--lr", "3e-3",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20", "--max-tokens", "1000",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.0",
        # five validations (measured: BLEU 1.13, 0.79, 3.35, 9.62, 25.42 at updates 20-100)
        "--max-update", "100", "--validate-interval-updates", "20", "--save-interval-updates", "20",
        "--validate-interval", "1000", "--save-interval", "1000",  # only every 20 updates, not per epoch
        "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--cpu", "--seed", "1",
        "--log-format", "simple", "--log-interval", "20", "--save-dir", save,
        *compare.eval_bleu_flags(beam=1), check=False, data_fixes=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = fairseq_runs.parse_log(proc.stdout.splitlines())["valid"]
    bleus = {rec["update"]: rec["bleu"] for rec in records}
    assert len(bleus) >= 5 and max(bleus.values()) > 0
    assert len(set(bleus.values())) > 1  # BLEU moved, so the choice means something
    # fairseq keeps the latest checkpoint with the highest BLEU (ties go to the later one)
    best = max(bleus.values())
    best_update = max(u for u, b in bleus.items() if b == best)

    from fairseq import checkpoint_utils  # loads through the plugin's weights-only loader
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_best.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == best_update
    assert state["extra_state"]["best"] == pytest.approx(best, abs=0.01)

    # an independent check of that BLEU: decode the valid set with the selected checkpoint
    # and score it with sacreBLEU against the raw text
    scored = fairseq_runs.generate_and_score(
        str(data), str(save / "checkpoint_best.pt"), str(raw / "valid.tgt"), str(tmp_path / "gen.txt"),
        ["--user-dir", USER_DIR, "--beam", "1", "--remove-bpe", "sentencepiece", "--cpu",
         "--max-len-a", "1.5", "--max-len-b", "10", "--batch-size", "64"],
        subset="valid", log=_quiet, env=cli_env())
    assert scored["bleu"] == pytest.approx(best, abs=0.011)


def test_mean_curve_over_seeds_uses_the_updates_every_seed_has():
    curves = [[[100, 6.0], [200, 5.0], [300, 4.0]], [[100, 8.0], [200, 4.0]]]
    assert fairseq_runs.mean_curve(curves) == [[100, 7.0, 6.0, 8.0], [200, 4.5, 4.0, 5.0]]
    assert fairseq_runs.finite_or_none({"a": [float("nan"), 1.5], "b": float("inf")}) == {"a": [None, 1.5], "b": None}


def test_train_time_of_a_killed_attempt_ends_at_its_last_logged_line(tmp_path):
    """A run killed twice and resumed: each killed attempt counts until the last line it
    logged, not until the log's last change (the next attempt's lines) nor the next start."""
    t0 = 1_795_000_000.0

    def stamp(t):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    log = tmp_path / "train.log"
    log.write_text(f"### {stamp(t0)} running: fairseq-train\n{stamp(t0 + 40)} | INFO | epoch 001: 50\n"
                   "a line without a time\n"
                   f"### {stamp(t0 + 3600)} running: fairseq-train\n{stamp(t0 + 3605)} | INFO | loaded\n"
                   f"### {stamp(t0 + 3700)} running: fairseq-train\n{stamp(t0 + 5000)} | INFO | done\n")
    # starts have fractions of a second; the "###" header of an attempt is stamped in whole seconds
    attempts = [{"start": t0 + 0.2, "end": None}, {"start": t0 + 3600.4, "end": None},
                {"start": t0 + 3700.6, "end": t0 + 5100}]
    assert fairseq_runs._attempt_seconds(attempts, str(log)) == pytest.approx(39.8 + 4.6 + 1399.4)
    # the last attempt, killed too, still ends at the log's last change
    os.utime(log, (t0 + 5010, t0 + 5010))
    attempts[-1]["end"] = None
    assert fairseq_runs._attempt_seconds(attempts, str(log)) == pytest.approx(39.8 + 4.6 + 1309.4)


# --------------------------------------------------------------------------------------
# Three test sets: every finished run scored on each (decoding only for a run scored before)
# --------------------------------------------------------------------------------------

def _hyps(path):
    hyps = fairseq_runs.parse_generate_output(fairseq_runs.read_log(str(path)))
    return [hyps[i] for i in range(len(hyps))]


def test_data_folder_names_its_test_sets(m30k_slice, m30k_three_sets):
    require_shared_data(MULTI30K)
    assert [(t["split"], t["name"]) for t in compare.corpus_info(str(m30k_slice))["test_sets"]] == [
        ("test", "test_2016_flickr")]
    sets = compare.corpus_info(str(m30k_three_sets))["test_sets"]
    assert [(t["split"], t["name"]) for t in sets] == [
        ("test", "test_2016_flickr"), ("test1", "test_2017_flickr"), ("test2", "test_2017_mscoco")]
    assert [len(pipeline.read_lines(t["references"])) for t in sets] == [20, 16, 12]
    assert pipeline.read_lines(sets[2]["references"])[0] == pipeline.read_parallel(
        str(MULTI30K / "test_2017_mscoco.en.gz"), str(MULTI30K / "test_2017_mscoco.de.gz"))[0][0][1]


@pytest.mark.slow
def test_every_test_set_is_scored_and_a_run_scored_before_is_decoded_only(m30k_slice, tmp_path):
    """A run trained on a folder with one test set (Post-LN) is scored on the two added later by the
    same command again (decoding its checkpoint_best.pt; nothing trains), with --report-only too; a
    run trained after they were added (Pre-LN) is scored on all three at once, and the two are paired
    on each set and over the sets. Each score is sacreBLEU of that set's hypotheses, in corpus order,
    against its raw references."""
    from realformer_tools.data import corpora

    data = copy_data(m30k_slice, tmp_path / "m30k_slice")
    out, results = tmp_path / "runs", tmp_path / "results" / "m30k.json"
    compare.compare(str(data), str(out), tiny_recipe(), backbones=("postln",), results_path=str(results),
                    threads=1, log=_quiet)
    first = json.loads(results.read_text())
    assert "test_sets" not in first and "bleu_per_seed_by_test_set" not in first["postln"]
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")}
    corpora.add_test_sets(str(data), raw_dir=str(raw_2017(tmp_path / "raw")))

    messages = []
    summary = compare.compare(str(data), str(out), tiny_recipe(), backbones=("postln",),
                              results_path=str(results), threads=1, log=messages.append, report_only=True)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps and not any("updates" in m and "ETA" in m
                                                                           for m in messages)
    assert any("decoding 1 finished runs on the test sets they lack" in m for m in messages)
    sets = compare.corpus_info(str(data))["test_sets"]
    run_dir = out / "postln" / "seed1"
    record = json.loads((run_dir / "result.json").read_text())
    assert list(record["bleu_by_test_set"]) == [t["name"] for t in sets]
    assert record["bleu_by_test_set"]["test_2016_flickr"] == record["bleu"] == first["postln"]["bleu"]
    for t in sets[1:]:
        hyps = _hyps(run_dir / f"generate_{t['name']}.txt")
        refs = pipeline.read_lines(t["references"])
        assert len(hyps) == len(refs) in (16, 12)
        assert record["bleu_by_test_set"][t["name"]] == pytest.approx(
            sacrebleu.corpus_bleu(hyps, [refs]).score, abs=0.006)
        assert record["test_set_scores"][t["name"]]["split"] == t["split"]
        assert (results.parent / "m30k_hyps" / f"postln_seed1.{t['name']}.txt").read_text().splitlines() == hyps
    entry = summary["postln"]
    assert entry["bleu_per_seed_by_test_set"] == {n: [v] for n, v in record["bleu_by_test_set"].items()}
    assert entry["bleu"] == first["postln"]["bleu"]  # the headline keeps its meaning
    assert [t["name"] for t in json.loads(results.read_text())["test_sets"]] == [t["name"] for t in sets]

    # asked again: nothing decoded again; a run trained now is scored on all three at once
    outputs = {p: p.stat().st_mtime_ns for p in out.rglob("generate*.txt")}
    messages.clear()
    again = compare.compare(str(data), str(out), tiny_recipe(), backbones=("postln", "preln"),
                            results_path=str(results), threads=1, log=messages.append)
    assert {p: p.stat().st_mtime_ns for p in outputs} == outputs
    assert sum("already done" in m for m in messages) == 1
    fresh = json.loads((out / "preln" / "seed1" / "result.json").read_text())
    assert list(fresh["bleu_by_test_set"]) == [t["name"] for t in sets]
    assert again["preln"]["bleu_per_seed_by_test_set"] == {n: [v] for n, v in fresh["bleu_by_test_set"].items()}
    diff = again["preln"]["seed_paired_vs_postln_by_test_set"]
    assert list(diff) == [t["name"] for t in sets]
    for name, paired in diff.items():
        assert paired["per_seed"] == [pytest.approx(again["preln"]["bleu_by_test_set"][name]
                                                    - again["postln"]["bleu_by_test_set"][name], abs=1e-9)]
    over = again["preln"]["seed_paired_vs_postln_over_test_sets"]
    assert over["seeds"] == [1]
    assert over["per_seed"] == [pytest.approx(sum(r["per_seed"][0] for r in diff.values()) / 3, abs=1e-9)]
    md = results.with_suffix(".md").read_text()
    assert "**Every test set**" in md and "ΔBLEU `test_2017_mscoco`" in md and "mean of the test sets" in md


RESUME_UPDATES = 22  # the slice's epochs are 18 updates: two epochs begun
SAVE_EVERY = 20  # --save-interval-updates: mid-epoch 2, where the mid-epoch case resumes


def _resume_env(data_fixes):
    from realformer_tools.launch import DATA_FIXES_ENV as DATA_FIXES_SWITCH

    return dict(cli_env(), **{DATA_FIXES_SWITCH: data_fixes})


def _resume_command(m30k_slice, run_dir):
    """The resume cases' one command; its run never stopped keeps checkpoint_2_20.pt (mid-epoch 2)."""
    recipe = tiny_recipe(max_update=RESUME_UPDATES, extra=["--save-interval-updates", str(SAVE_EVERY)])
    return compare.train_command(str(m30k_slice), "realformer", recipe, 1, str(run_dir))


def _end_parameters(run_dir):
    import torch

    from realformer_tools.fairseq_fixes import safe_checkpoint_loading

    with safe_checkpoint_loading.fairseq_checkpoint_types():  # weights only, fairseq's types allowed
        return torch.load(run_dir / "checkpoint_last.pt", map_location="cpu")["model"]


@pytest.fixture(scope="module")
def uninterrupted(m30k_slice, tmp_path_factory):
    """``uninterrupted(data_fixes)``: ``(run_dir, end parameters)`` of ``_resume_command`` never stopped,
    trained by the harness with the data fixes on ("1") or off ("0"), each once for the module (the
    cases resuming at different updates share it)."""
    runs = {}

    def whole(data_fixes):
        if data_fixes not in runs:
            run_dir = tmp_path_factory.mktemp(f"whole_fixes{data_fixes}") / "realformer" / "seed1"
            run_dir.mkdir(parents=True)
            record = fairseq_runs.train_resumable(_resume_command(m30k_slice, run_dir), str(run_dir), log=_quiet,
                                                  env=_resume_env(data_fixes))
            assert record["status"] == "finished" and record["updates"] == RESUME_UPDATES
            # every epoch trained once, in order (the fix must not move an uninterrupted run's epochs)
            assert re.findall(r"begin training epoch (\d+)", (run_dir / "train.log").read_text()) == ["1", "2"]
            runs[data_fixes] = run_dir, _end_parameters(run_dir)
        return runs[data_fixes]

    return whole


@pytest.mark.slow
@pytest.mark.parametrize("stop_at, loaded, data_fixes", [
    (20, "(epoch 2 @ 20 updates)", "1"), (18, "(epoch 2 @ 18 updates)", "1"), (18, "(epoch 2 @ 18 updates)", "0")],
    ids=["mid-epoch-2", "epoch-end", "epoch-end-fairseq-alone"])
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(m30k_slice, uninterrupted, tmp_path, stop_at, loaded,
                                                              data_fixes):
    """Stopped after its checkpoint at update ``stop_at`` (the slice's epochs are 18 updates) and
    resumed from that checkpoint_last.pt by the harness, a run ends with the parameters of the same
    command never stopped (``uninterrupted``, trained once per setting of the data fixes and shared by
    the cases), bit for bit. Without the data fixes (``resume_batches``) fairseq 0.12.2 builds a run
    resumed in epoch 2 other batches: when that case passes, the fix is no longer needed."""
    import shutil

    import torch

    env = _resume_env(data_fixes)
    whole_dir, whole = uninterrupted(data_fixes)
    run_dir = tmp_path / "resumed" / "realformer" / "seed1"
    cmd = _resume_command(m30k_slice, run_dir)
    run_dir.mkdir(parents=True)
    if stop_at % SAVE_EVERY == 0:
        # mid-epoch: an attempt killed after its save at stop_at left the checkpoint the run never
        # stopped saved there (the same command, the same save) as its checkpoint_last.pt
        (saved,) = whole_dir.glob(f"checkpoint_*_{stop_at}.pt")
        shutil.copyfile(saved, run_dir / "checkpoint_last.pt")
    else:
        # the end of an epoch, where fairseq keeps no numbered checkpoint (--no-epoch-checkpoints): the
        # same command stopped there (fairseq saves checkpoint_last.pt where it stops)
        first = [c if cmd[i - 1] != "--max-update" else str(stop_at) for i, c in enumerate(cmd)]
        subprocess.run(first, check=True, capture_output=True, env=env)
    (run_dir / "attempts.json").write_text(json.dumps([{"command": cmd, "start": 0.0, "end": None}]))
    record = fairseq_runs.train_resumable(cmd, str(run_dir), log=_quiet, env=env)
    assert record["status"] == "finished" and record["updates"] == RESUME_UPDATES
    log = (run_dir / "train.log").read_text()
    # restarted by the same call, fairseq continues from checkpoint_last.pt, in epoch 2 only
    assert re.findall(r"begin training epoch (\d+)", log) == ["2"]
    assert "Loaded checkpoint" in log and loaded in log and record["attempts"] == 2
    assert [rec["update"] for rec in record["curve"]][-1] == RESUME_UPDATES
    resumed = _end_parameters(run_dir)
    assert whole.keys() == resumed.keys()
    differing = [k for k in whole if not torch.equal(whole[k], resumed[k])]
    if data_fixes == "1":
        assert not differing, f"{len(differing)} of {len(whole)} tensors differ, e.g. {differing[:3]}"
    else:  # fairseq alone: other batches from epoch 2 on, other parameters
        assert len(differing) > len(whole) // 2, differing


def test_the_machine_field_of_a_report_gives_the_threads_the_runs_recorded_not_the_reporting_command():
    """A --report-only report trained nothing: its machine field says so and gives the threads each
    run recorded for its attempts (``machines``), counting the runs that record none; a command that
    trains describes its own --jobs and threads, as before."""
    from realformer_tools.experiments.translation.runs import parallel_note

    one = {"machines": [{"cpu": "AMD EPYC", "cpu_capability": "AVX2", "threads": 1}]}
    two = {"machines": [{"threads": 1}, {"threads": 2}]}  # resumed with other threads
    old = {"bleu": 30.0}  # imported from a results file written before runs recorded machines
    note = parallel_note(2, 1, report_only=True, runs=[one, two, old, None])
    assert note == ("report only: the command that wrote this trained nothing; threads the runs recorded: "
                    "OMP_NUM_THREADS=1 or 2 (1 of 3 runs record none: taken from a results file, which keeps no "
                    "threads per run, or trained before runs recorded them)")
    assert "--jobs" not in note
    assert parallel_note(1, None, report_only=True, runs=[old]).endswith(
        "the runs record no threads (taken from a results file, which keeps no threads per run, or trained "
        "before runs recorded them)")
    assert parallel_note(2, 1) == "--jobs 2: 2 fairseq trainings at once, OMP_NUM_THREADS=1 each"
    assert parallel_note(2, 1, runs=[one]) == ("--jobs 2: 2 fairseq trainings at once, OMP_NUM_THREADS=1 each; "
                                               "threads the runs recorded: OMP_NUM_THREADS=1")
