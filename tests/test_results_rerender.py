"""Committed results re-render from their JSON alone, and their statistics hold.

(a) every committed study JSON in results/ re-renders (``translation.rerender``) to exactly
    the committed JSON and Markdown: the tables are a function of the JSON, and
    re-rendering is idempotent;
(b) every ``seed_paired_*`` record is recomputed here from ``bleu_per_seed`` (or the MLM
    accuracies) with plain statistics and a printed t table, independent of the harness, and
    its mean, sd and interval are those of the unrounded differences (``scipy.stats``),
    rounded only where they are shown;
(c) every run outcome is one of ``ok`` / ``lagging`` / ``diverged``;
plus the stability-limit grid and partial (--report-only) reporting, with faked runs.
"""

import json
import math
import shutil
import statistics

import pytest
from conftest import REPO
from test_compare_backbones import m30k_slice, tiny_recipe  # noqa: F401  (fixture)

from realformer_tools.experiments import compare
from realformer_tools.experiments.translation import report, rerender, stability, stats
from realformer_tools.experiments.translation import runs as runs_module

RESULTS = REPO / "results"
STUDY_JSONS = sorted(p for p in RESULTS.glob("*.json") if rerender.kind(json.loads(p.read_text())) is not None)
# two-sided 95% Student t quantiles t_{0.975, df} from a printed table (df = seeds - 1)
T_975 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # two-sided 95%, by df


def _no_plot(summary, path):
    pass


def test_the_committed_study_results_are_found():
    names = {p.stem for p in STUDY_JSONS}
    assert {"multi30k_en_de", "depth_stress", "path_ablation", "lr_stress", "mlm_wikitext2", "speed_cpu"} <= names


@pytest.mark.parametrize("path", STUDY_JSONS, ids=lambda p: p.stem)
def test_committed_results_rerender_identically(path, tmp_path, monkeypatch):
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    kind = rerender.kind(json.loads(path.read_text()))
    if kind != "speed":  # PNGs are not compared; skip drawing them
        markdown, _ = rerender.writers(kind)
        monkeypatch.setattr(rerender, "writers", lambda k: (markdown, _no_plot))
    assert rerender.rerender(str(copy), log=lambda m: None) == kind
    assert (tmp_path / (path.stem + ".md")).read_text() == (RESULTS / (path.stem + ".md")).read_text()
    assert json.loads(copy.read_text()) == json.loads(path.read_text())


def _expected(values, reference, seeds, reference_seeds):
    ref = dict(zip(reference_seeds, reference))
    diffs = [v - ref[s] for s, v in zip(seeds, values) if s in ref and v is not None and ref[s] is not None]
    return diffs


def _check(record, values, reference, seeds, reference_seeds):
    diffs = _expected(values, reference, seeds, reference_seeds)
    assert record["per_seed"] == pytest.approx(diffs, abs=0.006)
    if not diffs:
        assert record["mean"] is None
        return 1
    mean = sum(diffs) / len(diffs)
    assert record["mean"] == pytest.approx(mean, abs=0.006)
    if len(diffs) < 3:
        assert "sd" not in record and "ci95" not in record
        return 1
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    half = T_975[len(diffs) - 1] * sd / math.sqrt(len(diffs))
    assert record["sd"] == pytest.approx(sd, abs=0.006)
    assert record["ci95"] == pytest.approx([mean - half, mean + half], abs=0.011)
    _check_unrounded(record, diffs)
    return 1


ROUNDED = 0.005 + 1e-9  # a value shown to 2 decimals is within half a unit of the last digit


def _check_unrounded(record, diffs):
    """The record's statistics are those of the exact differences, rounded only at the end:
    scipy's t interval over the unrounded differences (a 3-decimal accuracy's difference,
    -0.155, is not first rounded to -0.15 or -0.16)."""
    from scipy import stats as scipy_stats

    assert record["per_seed"] == pytest.approx(diffs, abs=1e-9)
    mean = scipy_stats.tmean(diffs)
    low, high = scipy_stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=scipy_stats.sem(diffs))
    assert abs(record["mean"] - mean) <= ROUNDED
    assert abs(record["sd"] - scipy_stats.tstd(diffs)) <= ROUNDED
    assert abs(record["ci95"][0] - low) <= ROUNDED and abs(record["ci95"][1] - high) <= ROUNDED


def _entries_checked(entries, metric, backbone_of=lambda k: k):
    by_backbone = {backbone_of(k): e for k, e in entries.items() if e is not None}
    checked = 0
    for k, e in entries.items():
        if e is None:
            continue
        for ref in ("postln", "preln"):
            key = f"seed_paired_vs_{ref}"
            if ref in by_backbone and backbone_of(k) != ref:
                r = by_backbone[ref]
                checked += _check(e[key], e[metric], r[metric], e["seeds"], r["seeds"])
            else:
                assert key not in e
    return checked


@pytest.mark.parametrize("path", [p for p in STUDY_JSONS if not p.stem.startswith("speed")], ids=lambda p: p.stem)
def test_seed_paired_differences_recomputed_from_the_per_seed_values(path):
    s = json.loads(path.read_text())
    kind = rerender.kind(s)
    if kind in ("comparison", "mlm"):
        metric = "mlm_accuracy_per_seed" if kind == "mlm" else "bleu_per_seed"
        checked = _entries_checked({b: s[b] for b in compare.MAIN_ORDER if b in s}, metric)
    elif kind == "ablation":
        checked = _entries_checked({k: s[k] for k in compare.ABLATION if k in s}, "bleu_per_seed",
                                   compare.ABLATION.get)
    elif kind == "depth":
        checked = sum(_entries_checked(row, "bleu_per_seed") for row in s["depths"].values())
    elif kind == "stability":
        checked = sum(_entries_checked(row, "bleu_per_seed") for row in s["grid"].values())
    else:  # lr sweep: {backbone: {lr: [run per seed]}}
        checked = 0
        for ref in ("postln", "preln"):
            for b, by_lr in s.get(f"seed_paired_vs_{ref}", {}).items():
                for lr, record in by_lr.items():
                    runs, refs = s["runs"][b][lr], s["runs"][ref][lr]
                    checked += _check(record, [e["bleu"] for e in runs], [e["bleu"] for e in refs],
                                      [e["seed"] for e in runs], [e["seed"] for e in refs])
        assert "seed_paired_vs_postln" in s
    assert checked >= 2


@pytest.mark.parametrize("path", [p for p in STUDY_JSONS if rerender.kind(json.loads(p.read_text())) == "comparison"],
                         ids=lambda p: p.stem)
def test_valid_loss_and_test_set_differences_recomputed(path):
    """A comparison's seed-paired best-valid-loss differences (3 decimals) and, where its runs
    were scored on several test sets, the per-set and over-the-sets differences, recomputed
    here from the per-seed values."""
    s = json.loads(path.read_text())
    entries = {b: s[b] for b in compare.MAIN_ORDER if b in s}
    checked = 0
    for b, e in entries.items():
        for ref in ("postln", "preln"):
            if ref not in entries or ref == b:
                continue
            r = entries[ref]
            record = e[f"seed_paired_valid_loss_vs_{ref}"]
            diffs = _expected(e["valid_loss_per_seed"], r["valid_loss_per_seed"], e["seeds"], r["seeds"])
            assert record["per_seed"] == pytest.approx(diffs, abs=1e-9)
            assert record["mean"] == pytest.approx(statistics.mean(diffs), abs=0.0005 + 1e-9)
            if len(diffs) >= 3:
                half = T_975[len(diffs) - 1] * statistics.stdev(diffs) / math.sqrt(len(diffs))
                assert record["ci95"] == pytest.approx([statistics.mean(diffs) - half, statistics.mean(diffs) + half],
                                                       abs=0.0011)
            checked += 1
            by_set = e.get(f"seed_paired_vs_{ref}_by_test_set")
            if by_set is None:
                assert "bleu_per_seed_by_test_set" not in e
                continue
            for name, rec in by_set.items():
                _check(rec, e["bleu_per_seed_by_test_set"][name], r["bleu_per_seed_by_test_set"][name], e["seeds"],
                       r["seeds"])
            over = e.get(f"seed_paired_vs_{ref}_over_test_sets")
            if over:
                means = [statistics.mean(by_set[n]["per_seed"][by_set[n]["seeds"].index(seed)] for n in by_set)
                         for seed in over["seeds"]]
                assert over["per_seed"] == pytest.approx(means, abs=1e-9)
    assert checked >= 6


def _outcomes(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("status_per_seed",):
                yield from v
            elif k == "outcome":
                yield v
            else:
                yield from _outcomes(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _outcomes(v)


@pytest.mark.parametrize("path", [p for p in STUDY_JSONS if not p.stem.startswith("speed")], ids=lambda p: p.stem)
def test_every_outcome_is_one_of_the_three_words(path):
    outcomes = list(_outcomes(json.loads(path.read_text())))
    assert outcomes and set(outcomes) <= set(stats.OUTCOMES)


def test_one_lagging_rule_in_every_study_with_outcomes():
    """``lagging`` means one thing in every committed study: more than the margin above the lowest
    best valid loss of the study's finished runs of the same seed (every backbone, lr and depth),
    whose values the JSON lists; recomputed here from the runs' own losses."""
    checked = 0
    for path in STUDY_JSONS:
        s = json.loads(path.read_text())
        k = rerender.kind(s)
        if k not in ("lr_sweep", "depth", "stability"):
            continue
        assert "lowest best valid loss" in s["reference"] and s["reference"].endswith("of the same seed")
        assert s["reference"] in (s.get("rule") or s.get("divergence_rule"))
        if k == "lr_sweep":
            runs = [(e["seed"], e["status"], e["best_valid_loss"], e["outcome"])
                    for by_lr in s["runs"].values() for es in by_lr.values() for e in es]
        else:
            rows = s["depths"].values() if k == "depth" else s["grid"].values()
            runs = [(seed, st, loss, outcome) for row in rows for e in row.values() if e
                    for seed, st, loss, outcome in zip(e["seeds"], e["fairseq_status_per_seed"],
                                                        e["valid_loss_per_seed"], e["status_per_seed"])]
        best = {}
        for seed, status, loss, _ in runs:
            if status == "finished" and loss is not None:
                best[seed] = min(best.get(seed, loss), loss)
        assert {int(k): v for k, v in s["reference_loss_per_seed"].items()} == best
        for seed, status, loss, outcome in runs:
            expected = ("diverged" if status != "finished" or loss is None
                        else "lagging" if loss > best[seed] + s["margin"] else "ok")
            assert outcome == expected, (path.name, seed, loss)
            checked += 1
    assert checked >= 9 + 20 + 30 + 48


def test_main_table_quotes_the_seed_paired_difference():
    md = (RESULTS / "multi30k_en_de.md").read_text()
    s = json.loads((RESULTS / "multi30k_en_de.json").read_text())
    record = s["realformer"]["seed_paired_vs_postln"]
    assert f"{record['mean']:+.2f} ± {record['sd']:.2f}" in md


def test_seed_paired_statistics_and_cells():
    # 3 seeds: differences 1.0, 2.0, 3.0 -> mean 2, sd 1, half-width 4.303 / sqrt(3)
    r = stats.seed_paired([11.0, 12.0, 13.0, None], [10.0, 10.0, 10.0, 10.0], [1, 2, 3, 4], [1, 2, 3, 4])
    assert r["seeds"] == [1, 2, 3] and r["per_seed"] == [1.0, 2.0, 3.0] and r["mean"] == 2.0 and r["sd"] == 1.0
    assert r["ci95"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)], abs=0.006)
    assert "**" not in report.seed_paired_cell({"p": r}, "p")  # -0.48 to +4.48: contains zero
    tight = stats.seed_paired([12.0, 12.1, 11.9], [10.0, 10.0, 10.0], [1, 2, 3], [1, 2, 3])
    assert tight["sd"] == 0.1 and tight["ci95"][0] > 0
    assert report.seed_paired_cell({"p": tight}, "p").count("**") == 2  # the interval excludes zero: bold
    around_zero = stats.seed_paired([10.1, 9.8, 10.2], [10.0, 10.0, 10.0], [1, 2, 3], [1, 2, 3])
    assert around_zero["ci95"][0] < 0 < around_zero["ci95"][1]
    assert "**" not in report.seed_paired_cell({"p": around_zero}, "p")
    two = stats.seed_paired([11.0, 9.5], [10.0, 10.0], [1, 2], [1, 2])
    assert two == {"seeds": [1, 2], "per_seed": [1.0, -0.5], "mean": 0.25}
    cell = report.seed_paired_cell({"p": two}, "p")
    assert "+1.00" in cell and "-0.50" in cell and "±" not in cell
    # a table's spread: ± sd with three seeds, never with two
    assert report.spread(10.0, 1.0, [9.0, 10.0, 11.0]) == "10.00 ± 1.00"
    assert "±" not in report.spread(10.0, 0.7, [9.5, 10.5]) and "9.50–10.50" in report.spread(10.0, 0.7, [9.5, 10.5])


def test_seed_paired_interval_is_computed_from_unrounded_differences():
    """The masked-LM Pre-LN minus Post-LN record: accuracies given to 3 decimals, so each
    difference has 3 (-0.155, +0.042, -0.069). Over the unrounded differences the 95%
    interval is -0.306 to +0.185 (scipy); rounding each difference to 2 decimals first
    would give -0.297 to +0.177, shown as -0.30 to +0.18."""
    from scipy import stats as scipy_stats

    post, pre = [11.648, 11.827, 11.423], [11.493, 11.869, 11.354]
    diffs = [b - a for a, b in zip(post, pre)]
    low, high = scipy_stats.t.interval(0.95, 2, loc=statistics.mean(diffs), scale=scipy_stats.sem(diffs))
    r = stats.seed_paired(pre, post, [1, 2, 3], [1, 2, 3])
    assert r["per_seed"] == pytest.approx([-0.155, 0.042, -0.069], abs=1e-12)
    assert r["ci95"] == [round(low, 2), round(high, 2)] == [-0.31, 0.18]
    assert r["mean"] == round(statistics.mean(diffs), 2) and r["sd"] == round(statistics.stdev(diffs), 2)
    assert "(95% CI -0.31 to +0.18)" in report.seed_paired_cell({"p": r}, "p")
    committed = json.loads((RESULTS / "mlm_wikitext2.json").read_text())["preln"]["seed_paired_vs_postln"]
    assert committed["ci95"] == [-0.31, 0.18]


def _fake_run(backbone, seed, lr, loss, status="finished"):
    return dict(status=status, reason=None if status == "finished" else "NaN/inf gradients", seed=seed,
                backbone=backbone, lr=lr, best_valid_loss=loss, final_valid_loss=loss,
                bleu=None if loss is None else round(40 - 3 * loss, 2), updates=10,
                curve=[] if loss is None else [{"update": 10, "loss": loss}], train_seconds=1.0,
                decode_seconds=1.0, checkpoint="c", log="l", signature=None, run_dir="r")


def test_stability_grid_marks_runs_and_reports_a_partial_grid(m30k_slice, tmp_path, monkeypatch):  # noqa: F811
    losses = {  # (lr, backbone, seed) -> best valid loss; None: diverged; missing: not run yet
        (1e-3, "postln", 1): 9.0, (1e-3, "realformer", 1): 6.5, (1e-3, "postln", 2): 8.0,
        (1e-3, "realformer", 2): 6.0, (5e-4, "postln", 1): 6.2, (5e-4, "realformer", 1): None,
    }
    seen = []

    def fake_train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, tag, report_only=False):
        seen.extend(specs)
        assert report_only
        return {s[0]: (_fake_run(s[1], s[2], s[5], losses[s[0]], "diverged" if losses[s[0]] is None else "finished")
                       if s[0] in losses else None) for s in specs}

    monkeypatch.setattr(stability, "train_all", fake_train_all)
    out = tmp_path / "depth"
    summary = stability.stability_limit(str(m30k_slice), str(out), tiny_recipe(lr=1e-3), lrs=[5e-4, 1e-3], depth=3,
                                        backbones=("postln", "realformer"), seeds=(1, 2), report_only=True,
                                        results_path=str(tmp_path / "stab.json"), log=lambda m: None)
    dirs = {s[0]: s[3] for s in seen}
    # the recipe's own lr runs where the depth test puts its runs (reused there); others under lr<lr>/
    assert dirs[(1e-3, "postln", 1)] == str(out / "L3" / "postln" / "seed1")
    assert dirs[(5e-4, "realformer", 2)] == str(out / "lr0.0005" / "L3" / "realformer" / "seed2")
    assert all(s[4].layers == 3 for s in seen)
    d = json.loads((tmp_path / "stab.json").read_text())
    assert d["grid"].keys() == summary["grid"].keys()
    assert list(d["grid"]) == ["0.001", "0.0005"] and d["reference_loss_per_seed"] == {"1": 6.2, "2": 6.0}
    # seed 1's reference 6.2: 9.0 lagging, 6.5 ok, None diverged; seed 2's 6.0: 8.0 lagging
    assert d["grid"]["0.001"]["postln"]["status_per_seed"] == ["lagging", "lagging"]
    assert d["grid"]["0.001"]["realformer"]["status_per_seed"] == ["ok", "ok"]
    assert d["grid"]["0.0005"]["realformer"]["status_per_seed"] == ["diverged"]
    assert d["grid"]["0.0005"]["postln"]["seeds"] == [1]
    paired = d["grid"]["0.001"]["realformer"]["seed_paired_vs_postln"]
    assert paired["per_seed"] == [pytest.approx(7.5), pytest.approx(6.0)] and "sd" not in paired
    assert d["progress"]["missing"] == [{"lr": 5e-4, "backbone": "postln", "seed": 2},
                                        {"lr": 5e-4, "backbone": "realformer", "seed": 2}]
    assert len(d["progress"]["done"]) == 6
    md = (tmp_path / "stab.md").read_text()
    assert "Partial results" in md and "lagging, lagging" in md
    # per cell, how many of its seeds diverged; the two questions' differences, one column per lr
    assert "| realformer | ok, ok (0 of 2 diverged); BLEU" in md and "diverged (1 of 1 diverged)" in md
    assert "| RealFormer minus Post-LN | +7.50 / +6.00 (mean +6.75) | — |" in md
    assert "RealFormer on Pre-LN minus Pre-LN" not in md  # neither of that pair ran
    # a cell with no finished run at all is "not run"
    del losses[(5e-4, "realformer", 1)]
    stability.stability_limit(str(m30k_slice), str(out), tiny_recipe(lr=1e-3), lrs=[5e-4, 1e-3], depth=3,
                              backbones=("postln", "realformer"), seeds=(1, 2), report_only=True,
                              results_path=str(tmp_path / "stab.json"), log=lambda m: None)
    d = json.loads((tmp_path / "stab.json").read_text())
    assert d["grid"]["0.0005"]["realformer"] is None
    assert "| realformer | not run |" in (tmp_path / "stab.md").read_text()


def test_report_only_comparison_keeps_only_the_finished_seeds(m30k_slice, tmp_path):  # noqa: F811
    recipe, out = tiny_recipe(), tmp_path / "runs"
    for backbone, seed, loss in (("postln", 1, 5.0), ("realformer", 1, 4.9), ("postln", 2, 5.1)):
        run_dir = out / backbone / f"seed{seed}"
        run_dir.mkdir(parents=True)
        result = _fake_run(backbone, seed, None, loss)
        result["command"] = compare.train_command(str(m30k_slice), backbone, recipe, seed, str(run_dir))
        (run_dir / "result.json").write_text(json.dumps(result))
    # a run of another recipe in a folder is not "finished" for this one
    other = out / "realformer" / "seed2"
    other.mkdir(parents=True)
    stale = dict(_fake_run("realformer", 2, None, 4.0),
                 command=compare.train_command(str(m30k_slice), "realformer", tiny_recipe(lr=5e-3), 2, str(other)))
    (other / "result.json").write_text(json.dumps(stale))
    assert runs_module.finished_run(str(m30k_slice), "realformer", recipe, 2, str(other)) is None
    summary = compare.compare(str(m30k_slice), str(out), recipe, backbones=("postln", "realformer"), seeds=(1, 2),
                              results_path=str(tmp_path / "partial.json"), report_only=True, log=lambda m: None)
    assert summary["postln"]["seeds"] == [1, 2] and summary["realformer"]["seeds"] == [1]
    assert summary["progress"]["missing"] == [{"backbone": "realformer", "seed": 2}]
    assert summary["realformer"]["seed_paired_vs_postln"]["per_seed"] == [pytest.approx(0.3)]
    md = (tmp_path / "partial.md").read_text()
    assert "Partial results" in md and "realformer seed 2" in md
    # 2 seeds of one backbone and 1 of the other: no single "over N seeds" is claimed
    assert "each backbone's finished seeds" in md and "over 2 seeds" not in md
    assert not (out / "realformer" / "seed2" / "train.log").exists()  # nothing trained
    assert statistics.mean(summary["postln"]["bleu_per_seed"]) == summary["postln"]["bleu"]


def test_stability_limit_flags_and_their_defaults(monkeypatch):
    import importlib

    cli = importlib.import_module("realformer_tools.cli.compare_backbones")  # what scripts/compare_backbones.py runs
    args = cli.parse_args(["--data", "d", "--out", "o", "--stability-limit", "--seeds", "1,2"])
    assert args.lrs == [1e-3, 5e-4, 2.5e-4] and args.depths == [12] and args.max_update == 1200
    assert args.backbones == list(stability.STABILITY_BACKBONES) and args.embed_dim == 128
    assert cli.STABILITY_BACKBONES == stability.STABILITY_BACKBONES
    assert cli.STABILITY_LRS == list(stability.STABILITY_LRS)
    sweep = cli.parse_args(["--data", "d", "--out", "o", "--lr-sweep"])
    assert sweep.lrs == [1e-3, 3e-3, 1e-2] and sweep.depths == [6, 12]
    assert cli.parse_args(["--data", "d", "--out", "o", "--report-only"]).report_only
    for bad in (["--stability-limit", "--depths", "6,12"], ["--depth-stress", "--report-only"],
                ["--stability-limit", "--layers", "3"]):
        with pytest.raises(SystemExit):
            cli.parse_args(["--data", "d", "--out", "o", *bad])


# --------------------------------------------------------------------------------------
# results/summary.png: every study's seed-paired differences, from the study JSONs
# --------------------------------------------------------------------------------------

def _committed_record(row, backbone, key):
    s = json.loads((RESULTS / f"{row['name']}.json").read_text())
    if row["kind"] == "depth":
        return (s["depths"][str(row["depth"])].get(backbone) or {}).get(key)
    if row["kind"] == "stability":
        return (next(r for lr, r in s["grid"].items() if float(lr) == row["lr"]).get(backbone) or {}).get(key)
    if row["kind"] == "lr_sweep":
        return next((r for lr, r in s.get(key, {}).get(backbone, {}).items() if float(lr) == row["lr"]), None)
    if row["kind"] == "ablation":
        from realformer_tools.experiments.translation.summary import PATHS

        path = {v: k for k, v in PATHS.items()}[row["variant"]]
        return s[path].get(key) if backbone == "realformer" else None
    variant = row.get("variant")
    if row.get("one_column"):  # a value residual backbone minus Pre-LN: "value residual, on test_2016_flickr"
        from realformer_tools.experiments.translation.summary import VALUE_RESIDUAL

        name, variant = variant.split(", ", 1)
        if backbone != "realformer_preln":  # the right column; the left one is empty
            return None
        backbone = {v: k for k, v in VALUE_RESIDUAL.items()}[name]
    if variant:  # a comparison's further test set, or the mean over its sets
        entry = s.get(backbone) or {}
        if variant == "mean of the test sets":
            return entry.get(f"{key}_over_test_sets")
        return (entry.get(f"{key}_by_test_set") or {}).get(variant[len("on "):])
    return (s.get(backbone) or {}).get(key)


def test_summary_rows_are_the_committed_seed_paired_records():
    """Every row's cells are the committed records; rows holding the same runs are one row (the
    same seeds: ``a = b``; a row's seeds part of another's: ``bigger [its seeds ... = smaller]``);
    a comparison's row names the test set it is scored on;
    the blocks come in order, the deep block by depth then learning rate (the 12+12 rows
    together), and the path ablation has its rows."""
    from realformer_tools.experiments.translation import summary

    rows = summary.summary_rows(str(RESULTS))
    labels = [summary.row_label(r) for r in rows]
    blocks = [r["block"] for r in rows]
    assert blocks == sorted(blocks, key=[b for b, _ in summary.BLOCKS].index)
    assert labels[0] == ("comparison (on test_2016_flickr) [its seeds 1-2 = path ablation, all three paths]: "
                         "En→De, 3+3, lr 1e-3, 1800 upd.")
    assert "comparison: En→Fr, 3+3, lr 1e-3, 1800 upd." in labels
    assert [lab for lab in labels if lab.startswith("path ablation")] == [
        f"path ablation ({p} path only): En→De, 3+3, lr 1e-3, 1800 upd." for p in ("encoder", "decoder", "cross")]
    # the 6+6 lr 1e-3 runs: once, the grid's three seeds holding the depth test's two
    six = [lab for lab in labels if ", 6+6, lr 1e-3," in lab]
    assert six == ["lr limit [its seeds 1-2 = depth stress]: En→De, 6+6, lr 1e-3, 1200 upd."]
    assert "depth stress = lr limit: En→De, 12+12, lr 1e-3, 1200 upd." in labels
    deep = [(r["depth"], r["lr"]) for r in rows if r["block"] == "deep"]
    assert deep == sorted(deep) and [d for d, _ in deep] == [6] * 4 + [12] * 3
    assert [r["kind"] for r in rows if r["block"] == "sweep"] == ["lr_sweep"] * 3
    assert labels[-1] == "masked LM: WikiText-2, 4 layers, lr 1e-3, 600 upd."
    for row in rows:
        for (backbone, key, _), cell in zip(summary.COMPARISONS, row["cells"]):
            record = _committed_record(row, backbone, key)
            if cell is None:
                assert not record
                continue
            assert cell["per_seed"] == record["per_seed"] and cell["mean"] == record["mean"]
            assert cell.get("ci95") == record.get("ci95")
    de = rows[0]["cells"]
    rec = json.loads((RESULTS / "multi30k_en_de.json").read_text())["realformer_preln"]["seed_paired_vs_preln"]
    n = len(rec["per_seed"])
    first_line = f"{rec['mean']:+.2f} [{rec['ci95'][0]:+.2f}, {rec['ci95'][1]:+.2f}], n={n}"
    assert summary.cell_text(de[1]).splitlines()[0] == first_line  # then its interval corrected for 3 sets
    lagging = next(r for r in rows if r["depth"] == 12 and r["lr"] == 2.5e-4)["cells"][0]
    assert summary.cell_text(lagging) == "-0.31, -0.56  (both lagging)"
    # the Pre-LN pair's seeds 1-5 are reruns that did not reproduce their committed runs: marked
    runs = json.loads((RESULTS / "multi30k_en_de.json").read_text())["reproducibility"]["runs"]
    reruns = sorted({r["seed"] for r in runs if r.get("committed_in") and not r["bleu_equal"]})
    assert reruns == [1, 2, 3, 4, 5] and de[1]["reruns"] == reruns and de[0]["reruns"] == []


def test_one_of_several_test_sets_is_filled_only_if_its_corrected_interval_excludes_zero():
    """test_2017_flickr's interval (+0.04 to +0.58) excludes zero, but it is one of three test
    sets: corrected for three (Bonferroni, t at 1 - 0.025 / 3, from the per-seed differences
    here) it holds zero, so the summary draws it hollow and prints both intervals."""
    from scipy.stats import t

    from realformer_tools.experiments.translation import summary

    rows = summary.summary_rows(str(RESULTS))
    flickr = next(r for r in rows if r.get("variant") == "on test_2017_flickr")["cells"][1]
    d = flickr["per_seed"]
    mean, sd = statistics.mean(d), statistics.stdev(d)
    half = t.ppf(1 - 0.025 / 3, len(d) - 1) * sd / math.sqrt(len(d))
    assert flickr["family"] == 3 and flickr["ci95"][0] > 0
    assert summary.corrected(flickr) == pytest.approx([mean - half, mean + half])
    assert mean - half < 0 < mean + half
    assert f"3 sets, corrected: [{mean - half:+.2f}, {mean + half:+.2f}]" in summary.cell_text(flickr)
    mean_row = next(r for r in rows if r.get("variant") == "mean of the test sets")["cells"][1]
    assert mean_row["family"] == 1 and summary.corrected(mean_row) == mean_row["ci95"]


def test_summary_axes_fit_the_data_and_numbers_stay_in_their_column():
    """Each block's panel is fitted to its own data: every seed's value and mean inside, the 3+3
    rows (the headline) on an axis a few BLEU wide, not stretched by the deep rows; an interval
    far wider than the rest of its panel (6+6 at 4e-3) runs past the axis, its ends printed; a
    one-row panel (the masked LM) keeps its whole interval; every printed number ends before
    the next panel."""
    from realformer_tools.experiments.translation import summary
    from realformer_tools.experiments.translation.figures import pyplot

    rows = summary.summary_rows(str(RESULTS))
    for block, _ in summary.BLOCKS:
        for col in range(2):
            cells = [r["cells"][col] for r in rows if r["block"] == block and r["cells"][col]]
            if not cells:
                continue
            low, high = summary._limits(cells)
            assert all(low < v < high for c in cells for v in [*c["per_seed"], c["mean"]])
            if block == "main":
                assert high - low < 4.0
            if block == "mlm":
                assert low < cells[0]["ci95"][0] and cells[0]["ci95"][1] < high
    wide = next(r for r in rows if r["depth"] == 6 and r["lr"] == 4e-3)["cells"][0]
    low, high = summary._limits([r["cells"][0] for r in rows if r["block"] == "deep"])
    assert wide["ci95"][0] < low and high < wide["ci95"][1] and high < 15
    assert "[-13.36, +19.05]" in summary.cell_text(wide)

    fig = summary.draw_summary(rows)
    renderer = fig.canvas.get_renderer()
    columns = fig.text_columns
    # the two panels of a block share one x-scale (the same rows, read across, on the same axis)
    by_block = {}
    for ax, _, _ in columns:
        by_block.setdefault(round(ax.get_position().y0, 4), []).append(ax.get_xlim())
    assert any(len(limits) == 2 for limits in by_block.values())
    assert all(len(set(limits)) == 1 for limits in by_block.values()), by_block
    assert sum(len(texts) for _, _, texts in columns) == sum(c is not None for r in rows for c in r["cells"])
    right_edges = sorted({ax.get_window_extent(renderer).x0 for ax, _, _ in columns})
    for _, text_ax, texts in columns:
        start = text_ax.get_window_extent(renderer).x0
        limit = next((x for x in right_edges if x > start), fig.bbox.x1)
        for text in texts:
            extent = text.get_window_extent(renderer)
            assert start <= extent.x0 and extent.x1 < limit, text.get_text()
    pyplot().close(fig)


def test_rerender_draws_the_summary_with_a_study_added_later(tmp_path):
    """A results JSON that appears later (the stability-limit study at depth 6) gets its rows
    in summary.png with no change to the code: the rows come from the folder's JSONs."""
    from realformer_tools.experiments.translation import summary

    for p in RESULTS.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    later = json.loads((RESULTS / "stability_depth12.json").read_text())
    later["depth"], later["recipe"]["settings"]["layers"] = 6, 6
    for row in later["grid"].values():
        for e in row.values():
            if e is not None:
                e["bleu_per_seed"] = [b + 20 for b in e["bleu_per_seed"]] + [25.0]
                e["seeds"] = e["seeds"] + [3]
                e["status_per_seed"] = e["status_per_seed"] + ["ok"]
    (tmp_path / "lr_limit_depth6.json").write_text(json.dumps(later))
    assert rerender.main(sorted(str(p) for p in tmp_path.glob("*.json"))) == 0
    png = (tmp_path / "summary.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20000
    rows = [r for r in summary.summary_rows(str(tmp_path)) if r["name"] == "lr_limit_depth6"]
    assert [summary.row_label(r) for r in rows] == [
        f"lr limit: En→De, 6+6, lr {lr}, 1200 upd." for lr in ("2.5e-4", "5e-4", "1e-3")]
    # three seeds now: the upgrade recomputed the seed-paired records, drawn with their interval
    assert all(len(c["per_seed"]) == 3 and c["ci95"] for r in rows for c in r["cells"])


def test_summary_has_a_row_per_test_set_and_their_mean(tmp_path):
    """A comparison scored on three test sets (the ten-seed layout: Pre-LN and RealFormer on
    Pre-LN on all three, Post-LN and RealFormer on the headline only) gets a row per further
    set and one for the mean over the sets, after its headline row; the upgrade computes their
    records from the per-seed BLEU, as the harness does."""
    from realformer_tools.experiments.translation import summary

    s = json.loads((RESULTS / "multi30k_en_de.json").read_text())
    for b, shift in (("preln", 0.0), ("realformer_preln", 0.5)):
        e = s[b]
        e["bleu_per_seed_by_test_set"] = {
            "test_2016_flickr": e["bleu_per_seed"],
            "test_2017_flickr": [v - 3 + shift * i for i, v in enumerate(e["bleu_per_seed"])],
            "test_2017_mscoco": [None] + [v - 8 + shift for v in e["bleu_per_seed"][1:]]}
    (tmp_path / "multi30k_en_de.json").write_text(json.dumps(s))
    rerender.rerender(str(tmp_path / "multi30k_en_de.json"), plot=False, log=lambda m: None)
    rows = [r for r in summary.summary_rows(str(tmp_path)) if r["name"] == "multi30k_en_de" and not r.get("one_column")]
    assert [r["variant"] for r in rows] == [None, "on test_2017_flickr", "on test_2017_mscoco", "mean of the test sets"]
    flickr, coco, mean = (r["cells"][1] for r in rows[1:])
    headline = [a - b for a, b in zip(s["realformer_preln"]["bleu_per_seed"], s["preln"]["bleu_per_seed"])]
    assert flickr["per_seed"] == pytest.approx([d + 0.5 * i for i, d in enumerate(headline)], abs=1e-9)
    assert coco["per_seed"] == pytest.approx([d + 0.5 for d in headline[1:]], abs=1e-9)
    later = s["preln"]["seeds"][1:]  # every committed seed but the first, whose mscoco BLEU is None
    assert coco["seeds"] == later and mean["seeds"] == later and len(later) >= 4
    saved = json.loads((tmp_path / "multi30k_en_de.json").read_text())["realformer_preln"]
    assert mean["per_seed"] == saved["seed_paired_vs_preln_over_test_sets"]["per_seed"]
    assert all(r["cells"][0] is None for r in rows[1:])  # Post-LN was scored on the headline only
    md = (tmp_path / "multi30k_en_de.md").read_text()
    assert "**Every test set**" in md and "| realformer_preln − preln |" in md


def test_a_study_written_beside_summary_png_redraws_it(tmp_path):
    """compare_backbones writing results/lr_limit_depth6.json (write_outputs) redraws the
    summary figure of its folder; a folder without one (a test's, a scratch run's) gets none."""
    from realformer_tools.experiments.translation import summary

    shutil.copy(RESULTS / "multi30k_en_de.json", tmp_path / "multi30k_en_de.json")
    later = json.loads((RESULTS / "stability_depth12.json").read_text())
    later["depth"] = 6
    report.write_outputs(later, str(tmp_path / "lr_limit_depth6.json"), stability.stability_markdown, _no_plot)
    assert not (tmp_path / "summary.png").exists()
    (tmp_path / "summary.png").write_bytes(b"stale")
    report.write_outputs(later, str(tmp_path / "lr_limit_depth6.json"), stability.stability_markdown, _no_plot)
    assert (tmp_path / "summary.png").read_bytes().startswith(b"\x89PNG")
    names = {r["name"] for r in summary.summary_rows(str(tmp_path))}
    assert names == {"multi30k_en_de", "lr_limit_depth6"}


def test_runs_trained_in_another_folder_are_reported_where_their_folder_is_now(m30k_slice, tmp_path,  # noqa: F811
                                                                               monkeypatch):
    """A run folder trained elsewhere (its result.json names /elsewhere/... paths) and copied
    here is reported with paths relative to where it is now, not the folder it was trained in;
    a run taken from a results file keeps the path that file records."""
    recipe, out = tiny_recipe(), tmp_path / "runs"
    for backbone in ("postln", "realformer"):
        run_dir = out / backbone / "seed1"
        run_dir.mkdir(parents=True)
        trained_in = f"/elsewhere/runs/{backbone}/seed1"
        result = dict(_fake_run(backbone, 1, None, 5.0), checkpoint=f"{trained_in}/checkpoint_best.pt",
                      log=f"{trained_in}/train.log",
                      command=compare.train_command(str(m30k_slice), backbone, recipe, 1, str(run_dir)))
        (run_dir / "result.json").write_text(json.dumps(result))
    monkeypatch.chdir(tmp_path)
    summary = compare.compare(str(m30k_slice), str(out), recipe, backbones=("postln", "realformer"), seeds=(1,),
                              results_path=str(tmp_path / "moved.json"), report_only=True, log=lambda m: None)
    assert summary["postln"]["checkpoints"] == [str(out / "postln" / "seed1" / "checkpoint_best.pt")]
    written = json.loads((tmp_path / "moved.json").read_text())
    assert written["realformer"]["checkpoints"] == ["runs/realformer/seed1/checkpoint_best.pt"]
    assert written["realformer"]["logs"] == ["runs/realformer/seed1/train.log"]
    assert "/elsewhere" not in (tmp_path / "moved.json").read_text()

    imported = dict(json.loads((out / "postln" / "seed1" / "result.json").read_text()), imported_from="results/x.json",
                    checkpoint="runs/compare/m30k/postln/seed1/checkpoint_best.pt")
    (out / "postln" / "seed1" / "result.json").write_text(json.dumps(imported))
    again = runs_module.finished_run(str(m30k_slice), "postln", recipe, 1, str(out / "postln" / "seed1"))
    assert again["checkpoint"] == "runs/compare/m30k/postln/seed1/checkpoint_best.pt"


def test_comparison_figure_pairs_curves_by_seed_and_bands_cover_the_same_seeds(tmp_path):
    """multi30k_en_de.png: the left panel is each comparison's validation loss minus its
    reference's on the same seed (recomputed here from the per-seed curves), the middle one
    every backbone over the seeds all of them have (seeds 1-5 here: not 5 against 10), and no
    two backbones share a colour."""
    from realformer_tools.experiments.translation import comparison_figure as compare
    from realformer_tools.experiments.translation import figures

    s = json.loads((RESULTS / "multi30k_en_de.json").read_text())
    pre, rfp = s["preln"], s["realformer_preln"]
    points = figures.paired_curves(rfp, pre)
    for u, mean, low, high in points:
        diffs = [dict(a)[u] - dict(b)[u] for a, b in zip(rfp["curve_per_seed"], pre["curve_per_seed"])]
        assert len(diffs) == 10 and mean == pytest.approx(statistics.mean(diffs)) and (low, high) == (
            pytest.approx(min(diffs)), pytest.approx(max(diffs)))
    shared = [1, 2, 3, 4, 5]
    for u, mean, low, high in figures.curve_over_seeds(pre, shared):
        values = [dict(c)[u] for c in pre["curve_per_seed"][:5]]
        assert mean == pytest.approx(statistics.mean(values)) and low == min(values) and high == max(values)
    assert len({figures.COLORS[b] for b in ("postln", "preln", "realformer", "realformer_preln")}) == 4
    drawn = {}
    real_savefig = compare.pyplot().Figure.savefig

    def keep(fig, path, **kwargs):
        drawn["axes"] = [(ax.get_title(), [line.get_label() for line in ax.get_lines()]) for ax in fig.axes]
        return real_savefig(fig, path, **kwargs)

    import unittest.mock

    with unittest.mock.patch.object(compare.pyplot().Figure, "savefig", keep):
        compare.plot_comparison(s, str(tmp_path / "m.png"))
    (left, left_lines), (middle, _), (right, _) = drawn["axes"]
    assert "minus the reference's, same seed" in left
    assert {"realformer − Post-LN (5 seeds)", "preln − Post-LN (5 seeds)", "realformer_preln − Pre-LN (10 seeds)"} \
        <= set(left_lines)
    assert "seeds 1-5 (the seeds every backbone drawn has)" in middle and "corrected for 3 sets" in right


def test_a_later_backbone_joins_the_middle_panel_once_it_has_the_seeds_the_others_share():
    """A value residual backbone with fewer seeds than the comparison's shared 1-5 is left out of the
    middle panel (and named as waiting) instead of shrinking every curve to its seeds; with seeds 1-5
    or more it is drawn over them; a comparison of later backbones only draws them."""
    from realformer_tools.experiments.translation import comparison_figure as compare

    s = json.loads((RESULTS / "multi30k_en_de.json").read_text())
    main = ["postln", "preln", "realformer", "realformer_preln"]
    s = {b: {"seeds": s[b]["seeds"]} for b in main}
    assert compare.middle_panel_backbones(s, main) == (main, [1, 2, 3, 4, 5], [])
    s["preln_vr"], s["realformer_preln_vr"] = {"seeds": [1, 2]}, {"seeds": [1, 2, 3, 4, 5, 6]}
    everyone = main + ["preln_vr", "realformer_preln_vr"]
    assert compare.middle_panel_backbones(s, everyone) == (main + ["realformer_preln_vr"], [1, 2, 3, 4, 5],
                                                           ["preln_vr"])
    s["preln_vr"]["seeds"] = [1, 2, 3, 4, 5, 7]
    assert compare.middle_panel_backbones(s, everyone) == (everyone, [1, 2, 3, 4, 5], [])
    s["preln_vr"]["seeds"] = [2, 3, 4, 5, 6]  # seed 1 missing: waits
    assert compare.middle_panel_backbones(s, everyone)[2] == ["preln_vr"]
    later = {"preln_vr": {"seeds": [1, 2]}, "realformer_preln_vr": {"seeds": [1, 2, 3]}}
    assert compare.middle_panel_backbones(later, list(later)) == (list(later), [1, 2], [])


def test_a_test_set_cell_is_bold_only_where_its_interval_corrected_for_the_sets_excludes_zero():
    """results/multi30k_en_de.md, the per-set table: test_2017_flickr's +0.04 to +0.58 excludes zero
    but, corrected for the pair's three test sets (Bonferroni, from the per-seed differences here),
    it does not, so the cell prints both and is not bold; the best valid loss, one question, stays
    bold on its own interval; a pair scored on one set gets no correction."""
    from scipy.stats import t

    s = json.loads((RESULTS / "multi30k_en_de.json").read_text())
    record = s["realformer_preln"]["seed_paired_vs_preln_by_test_set"]["test_2017_flickr"]
    d = record["per_seed"]
    half = t.ppf(1 - 0.025 / 3, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    low, high = statistics.mean(d) - half, statistics.mean(d) + half
    assert record["ci95"][0] > 0 and low < 0 < high
    md = (RESULTS / "multi30k_en_de.md").read_text()
    section = md[md.index("**Seed-paired differences, test BLEU per test set"):]
    row = next(line for line in section.splitlines() if line.startswith("| realformer_preln − preln |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    flickr = cells[2]
    assert f"corrected for 3 sets {low:+.2f} to {high:+.2f}" in flickr and "**" not in flickr, flickr
    assert cells[-1].count("**") == 2  # the valid loss: -0.035 to -0.016, one question
    postln = next(line for line in section.splitlines() if line.startswith("| realformer − postln |"))
    assert "corrected" not in postln  # scored on test2016 only


def test_the_test_set_panel_decides_a_value_residual_pair_by_its_family_correction():
    """A value residual pair carries its own correction (15 comparisons per set, 5 over the sets):
    an interval that excludes zero at 95% and after a correction for 3 sets, but not after the
    family's, is drawn hollow, on each set and over the sets; a pair without one keeps the
    correction for the number of sets."""
    from realformer_tools.experiments.translation import comparison_figure as compare
    from realformer_tools.experiments.translation.intervals import corrected_interval

    per_seed = [0.2, 0.9, 0.5, 1.3, 0.8]  # lower ends: 95% +0.22, for 3 +0.003, for 5 -0.12, for 15 -0.42

    def record(family=None):
        mean, sd = statistics.mean(per_seed), statistics.stdev(per_seed)
        r = dict(seeds=[1, 2, 3, 4, 5], per_seed=per_seed, mean=mean, sd=sd, ci95=corrected_interval(
            {"per_seed": per_seed}, 1))
        if family:
            r.update(ci95_corrected=corrected_interval(r, family), corrected_for=family, corrected_what="comparisons")
        return r

    sets = ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
    assert record()["ci95"][0] > 0 and corrected_interval(record(), 3)[0] > 0 > record(5)["ci95_corrected"][0]
    summary = {"preln_vr": {"seed_paired_vs_preln_by_test_set": {n: record(15) for n in sets},
                            "seed_paired_vs_preln_over_test_sets": record(5)},
               "realformer_preln": {"seed_paired_vs_preln_by_test_set": {n: record() for n in sets},
                                    "seed_paired_vs_preln_over_test_sets": record()}}
    plt = compare.pyplot()
    fig, ax = plt.subplots()
    compare.plot_test_sets(ax, summary, sets, [("realformer_preln", "preln"), ("preln_vr", "preln")])
    diamonds = [line for line in ax.get_lines() if line.get_marker() == "D"]
    filled = [line.get_markerfacecolor() != "white" for line in diamonds]
    plt.close(fig)
    # realformer_preln's four (3 sets corrected for 3, the mean uncorrected) filled; preln_vr's four hollow
    assert filled == [True] * 4 + [False] * 4
    assert "value residual pairs: for their family (5 and 15)" in ax.get_title()
