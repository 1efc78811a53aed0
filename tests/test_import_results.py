"""Runs taken from a committed results file (compare_backbones.py --import-results) instead of
being trained again: sound only because fairseq's CPU training is reproducible, which the
first test shows through the real CLIs before the import is trusted by the others."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, cli_env
from test_compare_backbones import _quiet, m30k_slice, tiny_recipe  # noqa: F401  (the fixture)

from realformer_nmt.errors import ConfigError, DataError
from realformer_tools.experiments import compare
from realformer_tools.experiments.translation import imports


@pytest.fixture(scope="module")
def committed(m30k_slice, tmp_path_factory):  # noqa: F811
    """A finished main comparison (Post-LN and RealFormer, seed 1) and its results file."""
    root = tmp_path_factory.mktemp("committed")
    results = root / "results" / "m30k.json"
    compare.compare(str(m30k_slice), str(root / "runs"), tiny_recipe(), backbones=("postln", "realformer"),
                    results_path=str(results), threads=1, log=_quiet)
    return results


def _entry_fields(entry):
    return {k: entry[k] for k in ("bleu_per_seed", "valid_loss_per_seed", "curve_per_seed", "seeds",
                                  "fairseq_status_per_seed", "updates")}


@pytest.mark.slow
def test_the_same_command_trains_the_same_run_again(m30k_slice, committed, tmp_path):  # noqa: F811
    """The premise of importing: Post-LN trained again in a new folder gives the committed
    validation curve and test BLEU exactly."""
    again = compare.compare(str(m30k_slice), str(tmp_path / "runs"), tiny_recipe(), backbones=("postln",),
                            results_path=str(tmp_path / "again.json"), threads=1, log=_quiet)
    assert _entry_fields(again["postln"]) == _entry_fields(json.loads(committed.read_text())["postln"])


@pytest.mark.slow
def test_imported_runs_are_reported_and_paired_with_a_new_backbone(m30k_slice, committed, tmp_path):  # noqa: F811
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
def test_another_recipe_is_refused_naming_the_flag(m30k_slice, committed, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="--max-update 4 where this run has --max-update 5"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(max_update=5))
    with pytest.raises(ConfigError, match="--dropout 0.1 where this run has --dropout 0.3"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(dropout=0.3))
    with pytest.raises(ConfigError, match="its realformer ran with .* --residual-attention-mode sum, "
                                          "this recipe gives .* --residual-attention-mode mean"):
        imports.import_results(str(committed), str(m30k_slice), str(tmp_path), tiny_recipe(), residual_mode="mean")
    assert not any(tmp_path.iterdir())  # nothing written on a refusal


@pytest.mark.slow
def test_a_stability_grid_is_imported_cell_by_cell(m30k_slice, tmp_path):  # noqa: F811
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


@pytest.mark.slow
def test_cli_refuses_import_for_other_studies_and_missing_files(tmp_path):
    script = str(REPO / "scripts" / "compare_backbones.py")
    cases = ((["--import-results", str(tmp_path / "none.json")], "--import-results .*none.json: no such file"),
             (["--lr-sweep", "--import-results", __file__],
              "applies to the main comparison, --depth-stress and --stability-limit, not --lr-sweep"))
    for extra, expected in cases:
        proc = subprocess.run([sys.executable, script, "--data", str(tmp_path), "--out", str(tmp_path / "o")] + extra,
                              capture_output=True, text=True, env=cli_env())
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert re.search(expected, lines[-1]), lines
