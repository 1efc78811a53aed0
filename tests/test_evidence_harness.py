"""The evidence harness of compare_backbones.py: --jobs, the paired bootstrap test against
Post-LN, the depth stress test, the per-path ablation, and portable result files.

Tiny models and a few updates: these prove the plumbing and the rules, not which backbone
is better (the committed results in results/ are what the README quotes).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from conftest import REPO, cli_env
from harness_helpers import tiny_recipe
from inprocess import run_in_process

from realformer_tools.experiments import compare, fairseq_runs
from realformer_tools.experiments.translation import depth as depth_study

pytest_plugins = ("harness_fixtures",)  # m30k_slice: once per session (per worker)

SCRIPT = str(REPO / "scripts" / "compare_backbones.py")
TINY_SIZE_CLI = ["--embed-dim", "32", "--ffn-dim", "64", "--heads", "2", "--max-update", "4",
                 "--warmup-updates", "2", "--max-tokens", "1000", "--beam", "1", "--log-interval", "2"]
TINY_CLI = ["--layers", "1", *TINY_SIZE_CLI, "--bootstrap-samples", "200"]


def _quiet(message):
    pass


# --------------------------------------------------------------------------------------
# Paired bootstrap resampling
# --------------------------------------------------------------------------------------

REFS = [f"ein {w} mann geht am {x} entlang ." for w in ("alter", "junger", "kleiner", "großer", "müder")
        for x in ("strand", "fluss", "weg", "zaun", "see", "markt")]


def _drop_third_word(sentences):
    return [" ".join(r.split()[:2] + r.split()[3:]) for r in sentences]


def test_paired_bootstrap_equally_good_systems_are_not_different():
    # each system is perfect on one half of the sentences and damaged on the other half
    half = len(REFS) // 2
    a = REFS[:half] + _drop_third_word(REFS[half:])
    b = _drop_third_word(REFS[:half]) + REFS[half:]
    result = compare.paired_bootstrap(a, b, REFS, samples=200)
    assert abs(result["delta_bleu"]) < 1.0
    assert result["p_value"] > 0.3


def test_paired_bootstrap_clear_difference_is_significant_and_delta_is_corpus_bleu():
    # the baseline drops the third word of every sentence; the system is perfect
    worse = _drop_third_word(REFS)
    result = compare.paired_bootstrap(worse, list(REFS), REFS, samples=200)
    expected = sacrebleu.corpus_bleu(REFS, [REFS]).score - sacrebleu.corpus_bleu(worse, [REFS]).score
    assert result["delta_bleu"] == pytest.approx(expected, abs=0.01) and expected > 20
    assert result["p_value"] <= 1 / 201 + 1e-9  # no resample comes near the observed gap
    assert result["signature"].startswith("nrefs:1|bs:200|seed:12345")
    with pytest.raises(Exception, match="one hypothesis per reference"):
        compare.paired_bootstrap(worse[:-1], REFS, REFS)


# --------------------------------------------------------------------------------------
# The depth test's rule (no training: fake run records)
# --------------------------------------------------------------------------------------

def _fake_run(seed, loss, status="finished"):
    return dict(status=status, reason=None if status == "finished" else "NaN/inf gradients", seed=seed,
                best_valid_loss=loss, bleu=None if loss is None else 10.0, updates=10,
                curve=[] if loss is None else [{"update": 10, "loss": loss}], train_seconds=1.0,
                decode_seconds=1.0, checkpoint="c", log="l", signature=None, run_dir="r")


def test_depth_stress_marks_runs_against_the_best_run_of_the_same_seed(m30k_slice, tmp_path, monkeypatch):
    losses = {  # (depth, backbone, seed) -> best valid loss (None: diverged)
        (1, "postln", 1): 9.0, (1, "realformer", 1): 5.0, (2, "postln", 1): 6.1, (2, "realformer", 1): None,
        (1, "postln", 2): 4.0, (1, "realformer", 2): 4.5, (2, "postln", 2): 5.2, (2, "realformer", 2): 4.9,
    }

    def fake_train_all(specs, *args, **kwargs):
        assert {s[0] for s in specs} == set(losses)
        for key, backbone, seed, run_dir, recipe, _lr in specs:
            assert recipe.layers == key[0] and run_dir.endswith(f"L{key[0]}/{backbone}/seed{seed}")
        return {k: _fake_run(k[2], v, "diverged" if v is None else "finished") for k, v in losses.items()}

    monkeypatch.setattr(depth_study, "train_all", fake_train_all)
    summary = compare.depth_stress(str(m30k_slice), str(tmp_path / "d"), tiny_recipe(), depths=(2, 1),
                                   backbones=("postln", "realformer"), seeds=(1, 2), margin=1.0,
                                   results_path=str(tmp_path / "depth.json"), log=_quiet)
    d = json.loads((tmp_path / "depth.json").read_text())
    assert list(d["depths"]) == ["1", "2"] and d["reference_loss_per_seed"] == {"1": 5.0, "2": 4.0}
    # seed 1's reference is 5.0: 9.0 lagging, 6.1 lagging, None diverged; seed 2's is 4.0: 5.2 lagging
    assert d["depths"]["1"]["postln"]["status_per_seed"] == ["lagging", "ok"]
    assert d["depths"]["1"]["realformer"]["status_per_seed"] == ["ok", "ok"]
    assert d["depths"]["2"]["postln"]["status_per_seed"] == ["lagging", "lagging"]
    assert d["depths"]["2"]["realformer"]["status_per_seed"] == ["diverged", "ok"]
    assert d["depths"]["2"]["realformer"]["valid_loss_per_seed"] == [None, 4.9]
    assert summary["depths"]["2"]["realformer"]["bleu_per_seed"] == [None, 10.0]
    assert "| realformer | diverged, ok |" in (tmp_path / "depth.md").read_text()
    assert (tmp_path / "depth.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------------------
# Through the CLI, with --jobs 2
# --------------------------------------------------------------------------------------

def _cli(*args):
    """The script's ``main`` with ``args`` in this process (tests/inprocess.py: its argv, cwd and
    environment, its output captured, the fixes it installs itself put back afterwards); the fairseq
    tools it starts are processes of their own as ever. The script started as a user starts it:
    test_depth_stress_cli_runs_every_depth_and_backbone and test_compare_backbones.py's
    test_cli_help_and_one_line_errors."""
    proc = run_in_process("realformer-compare-backbones", *args, check=False, env=cli_env(), cwd=REPO,
                          fixes=False, argv0=SCRIPT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_path_ablation_then_comparison_share_runs_and_test_against_postln(m30k_slice, tmp_path):
    out = tmp_path / "runs"
    stdout = _cli("--data", m30k_slice, "--out", out, "--path-ablation", "--seeds", "1", "--jobs", "2",
                  "--results", tmp_path / "ablation.json", *TINY_CLI)
    assert "2 fairseq trainings at once" in stdout
    ablation = json.loads((tmp_path / "ablation.json").read_text())
    assert [k for k in ("encoder", "decoder", "cross", "all", "postln") if k in ablation] == \
        ["encoder", "decoder", "cross", "all", "postln"]
    for key, paths in (("encoder", "encoder"), ("decoder", "decoder"), ("cross", "cross"),
                       ("all", "encoder,decoder,cross")):
        entry = ablation[key]
        assert entry["flags"][entry["flags"].index("--residual-attention-paths") + 1] == paths
        assert entry["seeds"] == [1] and len(entry["bleu_per_seed"]) == 1 and entry["bleu_std"] is None
        (test,) = entry["paired_vs_postln"]
        assert test["seed"] == 1 and 0 < test["p_value"] <= 1
        assert test["delta_bleu"] == pytest.approx(entry["bleu"] - ablation["postln"]["bleu"], abs=0.02)
        assert test["signature"].startswith("nrefs:1|bs:200")
    assert ablation["postln"]["flags"] == ["--arch", "transformer"] and "paired_vs_postln" not in ablation["postln"]
    hyps = tmp_path / "ablation_hyps" / "realformer_encoder_seed1.txt"
    assert len(hyps.read_text(encoding="utf-8").splitlines()) == 20  # the slice's test set

    # the main comparison in the same --out reuses the ablation's postln and realformer runs
    stdout = _cli("--data", m30k_slice, "--out", out, "--backbones", "postln,realformer", "--seeds", "1",
                  "--jobs", "2", "--results", tmp_path / "main.json", *TINY_CLI)
    assert stdout.count("already done") == 2
    main = json.loads((tmp_path / "main.json").read_text())
    assert main["realformer"]["bleu"] == ablation["all"]["bleu"]
    assert main["realformer"]["paired_vs_postln"][0]["p_value"] == ablation["all"]["paired_vs_postln"][0]["p_value"]
    assert "p=" in (tmp_path / "main.md").read_text()


@pytest.mark.slow
def test_depth_stress_cli_runs_every_depth_and_backbone(m30k_slice, tmp_path):
    # the script started as a user starts it (its own process), to its exit status 0
    proc = subprocess.run([sys.executable, SCRIPT, *map(str, (
        "--data", m30k_slice, "--out", tmp_path / "depth", "--depth-stress", "--depths", "1,2",
        "--backbones", "postln,realformer_mean", "--seeds", "1", "--jobs", "2",
        "--results", tmp_path / "depth.json", *TINY_SIZE_CLI))], capture_output=True, text=True,
        env=cli_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    d = json.loads((tmp_path / "depth.json").read_text())
    assert set(d["depths"]) == {"1", "2"}
    for depth in ("1", "2"):
        for b in ("postln", "realformer_mean"):
            e = d["depths"][depth][b]
            assert e["status_per_seed"][0] in ("ok", "lagging", "diverged")
            assert len(e["bleu_per_seed"]) == len(e["valid_loss_per_seed"]) == 1
        log = (tmp_path / "depth" / f"L{depth}" / "realformer_mean" / "seed1" / "train.log").read_text()
        assert f"--encoder-layers {depth} " in log and "--residual-attention-mode mean" in log
    assert d["recipe"]["settings"]["embed_dim"] == 32 and d["recipe"]["depths"] == [1, 2]


def test_cli_refuses_two_experiments_at_once(tmp_path, capsys):
    """The script's own argument checks (its parse_args, in this process: argparse's exit status 2)."""
    from realformer_tools.cli import compare_backbones as cli

    for extra, expected in ((["--path-ablation"], "--depth-stress and --path-ablation are separate experiments"),
                            (["--layers", "3"], "drop --layers")):
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(["--data", str(tmp_path), "--out", str(tmp_path), "--depth-stress", *extra])
        assert exit_.value.code == 2 and expected in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# Running several trainings at once; portable results
# --------------------------------------------------------------------------------------

def test_run_parallel_keeps_order_and_raises_the_first_error():
    import threading
    import time

    running, peak, lock = [0], [0], threading.Lock()

    def task(value, fail=False):
        def run():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            if fail:
                raise ValueError(f"task {value} failed")
            return value * 10
        return run

    out = fairseq_runs.run_parallel([(k, task(k)) for k in (3, 1, 2)], jobs=2)
    assert list(out.items()) == [(3, 30), (1, 10), (2, 20)] and peak[0] == 2
    with pytest.raises(ValueError, match="task 1 failed"):
        fairseq_runs.run_parallel([(k, task(k, fail=k == 1)) for k in (3, 1, 2)], jobs=2)
    assert fairseq_runs.threads_per_job(None, 2) == max(1, __import__("os").cpu_count() // 2)
    assert fairseq_runs.threads_per_job(3, 2) == 3


def test_portable_makes_repository_paths_relative():
    root = "/some/checkout"
    obj = {"log": "/some/checkout/runs/a/train.log", "cmd": "fairseq-train /some/checkout/data-bin/x --cpu",
           "root": "/some/checkout", "other": "/elsewhere/file", "n": [1.5, "/some/checkout/results"]}
    assert fairseq_runs.portable(obj, root) == {
        "log": "runs/a/train.log", "cmd": "fairseq-train data-bin/x --cpu", "root": ".",
        "other": "/elsewhere/file", "n": [1.5, "results"]}


MACHINE_PATH = re.compile(r"(^|[\s'\"=:(])/(work|home|root|tmp|Users|usr|opt|mnt|data)/")


def test_committed_results_hold_no_machine_paths():
    found = []

    def walk(obj, where):
        if isinstance(obj, str):
            if MACHINE_PATH.search(obj):
                found.append(f"{where}: {obj[:120]}")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")

    files = sorted(Path(REPO / "results").rglob("*.json"))
    assert files, "no committed results found"
    for path in files:
        walk(json.loads(path.read_text(encoding="utf-8")), str(path.relative_to(REPO)))
        text = path.with_suffix(".md").read_text(encoding="utf-8") if path.with_suffix(".md").exists() else ""
        for line in text.splitlines():
            if MACHINE_PATH.search(line):
                found.append(f"{path.with_suffix('.md').relative_to(REPO)}: {line[:120]}")
    assert not found, "absolute machine paths in committed results:\n" + "\n".join(found[:20])
