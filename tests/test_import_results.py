"""Runs taken from a committed results file (compare_backbones.py --import-results) instead of
being trained again: sound only because fairseq's CPU training is reproducible, which the
first test shows through the real CLIs before the import is trusted by the others."""

import json
import os
import re
import statistics

import pytest
from harness_helpers import tiny_recipe
from test_compare_backbones import _quiet

from realformer_nmt.errors import ConfigError, DataError
from realformer_tools.experiments import compare
from realformer_tools.experiments.translation import imports

pytest_plugins = ("harness_fixtures",)  # m30k_slice, m30k_three_sets, tiny_comparison: once per session


@pytest.fixture(scope="module")
def committed(m30k_slice, tiny_comparison, tmp_path_factory):
    """A finished main comparison (Post-LN and RealFormer, seed 1) and its results file: the session's
    ``tiny_comparison`` runs (trained once, shared with test_compare_backbones) reported alone."""
    out = tiny_comparison[0]
    results = tmp_path_factory.mktemp("committed") / "results" / "m30k.json"
    compare.compare(str(m30k_slice), str(out), tiny_recipe(), backbones=("postln", "realformer"),
                    results_path=str(results), threads=1, log=_quiet, report_only=True)
    return results


def _entry_fields(entry):
    return {k: entry[k] for k in ("bleu_per_seed", "valid_loss_per_seed", "curve_per_seed", "seeds",
                                  "fairseq_status_per_seed", "updates")}


@pytest.mark.slow
def test_the_same_command_trains_the_same_run_again(m30k_slice, committed, tmp_path):
    """The premise of importing: Post-LN trained again in a new folder gives the committed
    validation curve and test BLEU exactly."""
    again = compare.compare(str(m30k_slice), str(tmp_path / "runs"), tiny_recipe(), backbones=("postln",),
                            results_path=str(tmp_path / "again.json"), threads=1, log=_quiet)
    assert _entry_fields(again["postln"]) == _entry_fields(json.loads(committed.read_text())["postln"])
    # the report says so: the run trained again reproduces the file's (RealFormer: reported as the file has it)
    report = compare.compare(str(m30k_slice), str(tmp_path / "runs"), tiny_recipe(), backbones=("postln",),
                             results_path=str(tmp_path / "report.json"), report_only=True,
                             import_from=str(committed), log=_quiet)
    (record,) = report["reproducibility"]["runs"]
    assert (record["backbone"], record["seed"], record["committed_in"]) == ("postln", 1, str(committed))
    assert record["bleu_equal"] and record["valid_loss_equal"] and record["curve_equal"]
    assert record["rerun_bleu"] == record["committed_bleu"] == again["postln"]["bleu"]
    assert report["realformer"]["imported_from_per_seed"] == [str(committed)]
    assert "1 of 1 runs trained again reproduce the committed run exactly" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_imported_runs_are_reported_and_paired_with_a_new_backbone(m30k_slice, committed, tmp_path):
    old = json.loads(committed.read_text())
    out, results, messages = tmp_path / "runs", tmp_path / "m30k.json", []
    written = imports.import_results(str(committed), str(m30k_slice), str(out), tiny_recipe(), log=messages.append)
    assert sorted(written) == [str(out / "postln" / "seed1"), str(out / "realformer" / "seed1")]
    assert (out / "realformer" / "seed1" / "hypotheses.txt").read_text().splitlines() == (
        committed.parent / "m30k_hyps" / "realformer_seed1.txt").read_text().splitlines()

    summary = compare.compare(str(m30k_slice), str(out), tiny_recipe(), backbones=("postln", "preln", "realformer"),
                              results_path=str(results), threads=1, log=messages.append)
    # only Pre-LN trained; the imported runs are reported as committed, tests included
    assert sum("already done" in m for m in messages) == 2 and (out / "preln" / "seed1" / "checkpoint_best.pt").exists()
    assert not (out / "postln" / "seed1" / "checkpoint_best.pt").exists()
    for b in ("postln", "realformer"):
        assert _entry_fields(summary[b]) == _entry_fields(old[b])
        assert summary[b]["imported_from_per_seed"] == [str(committed)]
    assert "imported_from_per_seed" not in summary["preln"]
    assert summary["realformer"]["paired_vs_postln"] == old["realformer"]["paired_vs_postln"]
    assert summary["preln"]["paired_vs_postln"][0]["baseline_bleu"] == pytest.approx(old["postln"]["bleu"], abs=0.01)
    table = results.with_suffix(".md").read_text()
    assert f"Taken from `{committed}`" in table and "postln seed 1, realformer seed 1" in table

    # a second import leaves every run alone, the trained one included
    assert imports.import_results(str(committed), str(m30k_slice), str(out), tiny_recipe(), log=_quiet) == []


@pytest.mark.slow
def test_another_recipe_is_refused_naming_the_flag(m30k_slice, committed, tmp_path):
    with pytest.raises(ConfigError, match="--max-update 4 where this run has --max-update 5"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(max_update=5))
    with pytest.raises(ConfigError, match="--dropout 0.1 where this run has --dropout 0.3"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(dropout=0.3))
    with pytest.raises(ConfigError, match="its realformer ran with .* --residual-attention-mode sum, "
                                          "this recipe gives .* --residual-attention-mode mean"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(), residual_mode="mean")
    assert not any(tmp_path.iterdir())  # nothing written on a refusal


@pytest.mark.slow
def test_a_stability_grid_is_imported_cell_by_cell(m30k_slice, tmp_path):
    """The grid's runs at every learning rate come back from its results file (a fresh machine
    resumes a grid that spans sessions): nothing trains again and the cells are the file's."""
    grid = dict(lrs=[1e-3, 5e-4], depth=1, backbones=("postln",), seeds=(1,), threads=1)
    committed = tmp_path / "results" / "stab.json"
    first = compare.stability_limit(str(m30k_slice), str(tmp_path / "trained"), tiny_recipe(lr=1e-3),
                                    results_path=str(committed), log=_quiet, **grid)
    out, messages = tmp_path / "fresh", []
    written = imports.import_results(str(committed), str(m30k_slice), str(out), tiny_recipe(lr=1e-3),
                                     study="stability", log=_quiet)
    assert sorted(written) == [str(out / "L1" / "postln" / "seed1"), str(out / "lr0.0005" / "L1" / "postln" / "seed1")]
    again = compare.stability_limit(str(m30k_slice), str(out), tiny_recipe(lr=1e-3),
                                    results_path=str(tmp_path / "again.json"), log=messages.append, **grid)
    assert sum("already done" in m for m in messages) == 2 and not list(out.rglob("*.pt"))
    for lr in ("0.001", "0.0005"):
        assert _entry_fields(again["grid"][lr]["postln"]) == _entry_fields(first["grid"][lr]["postln"])
        assert again["grid"][lr]["postln"]["imported_from_per_seed"] == [str(committed)]
    assert again["progress"]["missing"] == []
    assert f"Taken from `{committed}`" in (tmp_path / "again.md").read_text()
    assert "lr 0.0005 postln seed 1" in (tmp_path / "again.md").read_text()
    # a partial grid (cells "not run") gives back only its finished runs
    partial = tmp_path / "results" / "partial.json"
    compare.stability_limit(str(m30k_slice), str(tmp_path / "trained"), tiny_recipe(lr=1e-3), results_path=str(partial),
                            log=_quiet, report_only=True, **dict(grid, backbones=("postln", "realformer")))
    assert json.loads(partial.read_text())["grid"]["0.001"]["realformer"] is None
    written = imports.import_results(str(partial), str(m30k_slice), str(tmp_path / "fresh2"), tiny_recipe(lr=1e-3),
                                     study="stability", log=_quiet)
    assert sorted(os.path.relpath(d, tmp_path / "fresh2") for d in written) == [
        os.path.join("L1", "postln", "seed1"), os.path.join("lr0.0005", "L1", "postln", "seed1")]
    # another learning rate for the recipe is refused before anything is written; so is the wrong study
    with pytest.raises(ConfigError, match="--lr 0.001 where this run has --lr 0.002"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path / "x"), tiny_recipe(lr=2e-3),
                               study="stability")
    with pytest.raises(ConfigError, match="its grid is at 1\\+1 layers, this run has --depths 2"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path / "x"), tiny_recipe(lr=1e-3),
                               study="stability", depth=2)
    with pytest.raises(DataError, match="not a depth stress results file"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path / "x"), tiny_recipe(lr=1e-3),
                               study="depth")
    assert not (tmp_path / "x").exists()


def test_cli_refuses_import_for_other_studies_and_missing_files(tmp_path, capsys):
    """The script's own argument checks (its parse_args, in this process: argparse's exit status 2)."""
    from realformer_tools.cli import compare_backbones as cli

    cases = ((["--import-results", str(tmp_path / "none.json")], "--import-results .*none.json: no such file"),
             (["--lr-sweep", "--import-results", __file__],
              "applies to the main comparison, --depth-stress and --stability-limit, not --lr-sweep"))
    for extra, expected in cases:
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(["--data", str(tmp_path), "--out", str(tmp_path / "o")] + extra)
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert re.search(expected, lines[-1]), lines


# --------------------------------------------------------------------------------------
# The ten-seed layout, with fake finished runs (no training): the committed file's runs and
# backbones in memory under --report-only, per-test-set differences, the harness's reproducibility
# --------------------------------------------------------------------------------------

SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


def _fake_finished(data, out, backbone, seed, bleu, loss, by_set=None, seconds=60.0):
    """A finished run's folder as the harness leaves it (result.json, generate.txt), no checkpoint."""
    from realformer_tools.experiments.translation.recipe import ENVIRONMENT

    run_dir = out / backbone / f"seed{seed}"
    run_dir.mkdir(parents=True)
    refs = compare.corpus_info(str(data))["references"]
    lines = open(refs, encoding="utf-8").read().splitlines()
    hyps = [" ".join(r.split()[: len(r.split()) - (i + seed + len(backbone)) % 3]) for i, r in enumerate(lines)]
    (run_dir / "generate.txt").write_text("".join(f"D-{i}\t-0.5\t{h}\n" for i, h in enumerate(hyps)))
    record = dict(status="finished", reason=None, seconds=seconds, attempts=1, updates=4,
                  curve=[{"update": 2, "loss": loss + 0.5}, {"update": 4, "loss": loss}],
                  command=compare.train_command(str(data), backbone, tiny_recipe(), seed, str(run_dir)),
                  log=str(run_dir / "train.log"), backbone=backbone, seed=seed, lr=1e-3, train_seconds=seconds,
                  best_valid_loss=loss, final_valid_loss=loss, bleu=bleu, sacrebleu=None,
                  signature="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", decode_seconds=1.0,
                  checkpoint=str(run_dir / "checkpoint_best.pt"), environment=dict(ENVIRONMENT))
    if by_set:
        record["bleu_by_test_set"] = dict(zip(SETS, by_set))
    (run_dir / "result.json").write_text(json.dumps(record))
    return record


def test_ten_seed_layout_from_a_committed_file_with_reproducibility(m30k_three_sets, tmp_path):
    """The committed file has four backbones, seeds 1-3, scored on test_2016_flickr only. New
    runs of Pre-LN and RealFormer on Pre-LN (seeds 1, 4, 5, on three test sets) are reported
    with --report-only beside it: seeds 2-3 come from the file in memory (nothing is written
    into the run folder), Post-LN and RealFormer as the file has them (seeds 1-3); seed 1,
    trained again, is checked against the file (Pre-LN equal, RealFormer on Pre-LN not); the
    per-set and over-the-sets differences use the seeds scored there."""
    data = m30k_three_sets
    old, committed = tmp_path / "old", tmp_path / "results" / "m30k.json"
    base = {"postln": 30.0, "preln": 29.0, "realformer": 30.1, "realformer_preln": 30.0}
    for b, bleu in base.items():
        for seed in (1, 2, 3):
            _fake_finished(data, old, b, seed, round(bleu + 0.3 * seed, 2), round(5.0 - 0.01 * seed, 3),
                           seconds=100.0 + seed)
    # the committed file: the old layout (one test set), as results/multi30k_en_de.json is
    sets = compare.corpus_info(str(data))["test_sets"]
    for t in sets[1:]:
        os.rename(data / f"{t['split']}.en-de.en.bin", data / f"{t['split']}.hidden")
    try:
        compare.compare(str(data), str(old), tiny_recipe(), backbones=tuple(base), seeds=(1, 2, 3),
                        results_path=str(committed), report_only=True, log=_quiet)
    finally:
        for t in sets[1:]:
            os.rename(data / f"{t['split']}.hidden", data / f"{t['split']}.en-de.en.bin")
    old_file = json.loads(committed.read_text())
    assert "bleu_per_seed_by_test_set" not in old_file["preln"]

    new = tmp_path / "new"
    pre = {1: (29.3, 4.99, (29.3, 25.0, 20.0)), 4: (30.0, 4.97, (30.0, 25.5, 21.0)),
           5: (29.5, 4.98, (29.5, 25.2, 20.1))}
    real = {1: (30.5, 4.985, (30.5, 26.0, 21.5)), 4: (30.9, 4.95, (30.9, 26.1, 21.0)),
            5: (29.9, 4.96, (29.9, 25.9, 20.5))}
    for b, table in (("preln", pre), ("realformer_preln", real)):
        for seed, (bleu, loss, by_set) in table.items():
            _fake_finished(data, new, b, seed, bleu, loss, by_set, seconds=200.0 + seed)
    results, messages = tmp_path / "results" / "ten.json", []
    summary = compare.compare(str(data), str(new), tiny_recipe(), backbones=("preln", "realformer_preln"),
                              seeds=(1, 2, 3, 4, 5), results_path=str(results), report_only=True,
                              import_from=str(committed), log=messages.append)
    assert not (new / "preln" / "seed2").exists()  # report-only writes no run folder
    assert summary["postln"]["seeds"] == summary["realformer"]["seeds"] == [1, 2, 3]
    assert summary["postln"]["bleu_per_seed"] == old_file["postln"]["bleu_per_seed"]
    assert summary["preln"]["seeds"] == [1, 2, 3, 4, 5]
    assert summary["preln"]["bleu_per_seed"] == [29.3, 29.6, 29.9, 30.0, 29.5]
    assert summary["preln"]["imported_from_per_seed"] == [None, str(committed), str(committed), None, None]
    assert summary["progress"]["missing"] == []
    by_set = summary["realformer_preln"]["bleu_per_seed_by_test_set"]
    assert by_set["test_2017_mscoco"] == [21.5, None, None, 21.0, 20.5]
    assert by_set["test_2016_flickr"] == summary["realformer_preln"]["bleu_per_seed"]
    # Pre-LN seeds 1-5 against RealFormer on Pre-LN on the headline; seeds 1, 4, 5 on the 2017 sets
    d = summary["realformer_preln"]
    assert d["seed_paired_vs_preln"]["seeds"] == [1, 2, 3, 4, 5]
    flickr17 = d["seed_paired_vs_preln_by_test_set"]["test_2017_flickr"]
    assert flickr17["seeds"] == [1, 4, 5] and flickr17["per_seed"] == pytest.approx([1.0, 0.6, 0.7])
    over = d["seed_paired_vs_preln_over_test_sets"]
    expected = [statistics.mean([a - b for a, b in zip(real[s][2], pre[s][2])]) for s in (1, 4, 5)]
    assert over["test_sets"] == list(SETS) and over["seeds"] == [1, 4, 5]
    assert over["per_seed"] == pytest.approx(expected, abs=1e-9)
    assert over["mean"] == round(statistics.mean(expected), 2) and over["sd"] == round(statistics.stdev(expected), 2)
    half = 4.303 * statistics.stdev(expected) / 3 ** 0.5
    assert over["ci95"] == pytest.approx([statistics.mean(expected) - half, statistics.mean(expected) + half],
                                         abs=0.006)
    # against Post-LN only where Post-LN has a score: the headline, seeds 1-3
    assert d["seed_paired_vs_postln"]["seeds"] == [1, 2, 3]
    assert list(d["seed_paired_vs_postln_by_test_set"]) == ["test_2016_flickr"]
    assert "seed_paired_vs_postln_over_test_sets" not in d
    loss = d["seed_paired_valid_loss_vs_preln"]
    assert loss["per_seed"] == pytest.approx([-0.005, 0.0, 0.0, -0.02, -0.02], abs=1e-9) and loss["mean"] == -0.009
    # reproducibility: seed 1 trained again: Pre-LN gives the committed run, RealFormer on Pre-LN does not
    runs = {(r["backbone"], r["seed"]): r for r in summary["reproducibility"]["runs"]}
    assert sorted(runs) == [("preln", 1), ("preln", 4), ("preln", 5), ("realformer_preln", 1),
                            ("realformer_preln", 4), ("realformer_preln", 5)]
    assert runs[("preln", 1)] == dict(backbone="preln", seed=1, committed_in=str(committed), committed_bleu=29.3,
                                      rerun_bleu=29.3, bleu_equal=True, committed_valid_loss=4.99,
                                      rerun_valid_loss=4.99, valid_loss_equal=True, curve_equal=True)
    assert (runs[("realformer_preln", 1)]["committed_bleu"], runs[("realformer_preln", 1)]["bleu_equal"],
            runs[("realformer_preln", 1)]["valid_loss_equal"]) == (30.3, False, False)
    assert runs[("preln", 4)] == {"backbone": "preln", "seed": 4, "committed_in": None}
    md = results.with_suffix(".md").read_text()
    assert "| backbone | seeds | test BLEU |" in md and "| postln | 1-3 |" in md and "| preln | 1-5 |" in md
    assert "1 of 2 runs trained again reproduce the committed run exactly" in md
    assert "- preln seed 1: BLEU 29.30 against 29.30" in md and "(**differs**)" in md
    assert ("No earlier record to compare with when first trained (trained in this run folder, or carried forward "
            "from the file's own reproducibility records): preln seeds 4-5; realformer_preln seeds 4-5.") in md
    assert "| realformer_preln − preln |" in md and "not scored" in md
    assert results.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    # the file written now is the committed one of the next report: its records are kept, not recomputed
    # against themselves (seed 4 stays first trained here; seed 1 keeps the first file's values)
    again = compare.compare(str(data), str(new), tiny_recipe(), backbones=("preln", "realformer_preln"),
                            seeds=(1, 2, 3, 4, 5), results_path=str(tmp_path / "results" / "again.json"),
                            report_only=True, import_from=str(results), log=_quiet)
    assert again["reproducibility"]["runs"] == summary["reproducibility"]["runs"]
    for b in ("postln", "preln", "realformer", "realformer_preln"):
        assert again[b]["bleu_per_seed"] == summary[b]["bleu_per_seed"]
        assert again[b].get("bleu_per_seed_by_test_set") == summary[b].get("bleu_per_seed_by_test_set")
    # and the re-rendered JSON (upgrade) is what the harness wrote, its Markdown too
    from realformer_tools.experiments.translation import rerender

    copy = tmp_path / "copy" / "ten.json"
    copy.parent.mkdir()
    copy.write_text(results.read_text())
    rerender.rerender(str(copy), plot=False, log=_quiet)
    assert json.loads(copy.read_text()) == json.loads(results.read_text())
    assert copy.with_suffix(".md").read_text() == md
