"""The learning-rate grid's report (issue 66): intervals corrected for the rates tested, each
backbone's best rate chosen by validation loss (never test BLEU), and every run's wall time
and resumes. Built on small hand-made grids, so each rule can be seen to fail."""

import json
import pathlib
import statistics

import pytest
from scipy.stats import t

from realformer_tools.experiments.translation import stability, summary
from realformer_tools.experiments.translation.stats import add_seed_paired

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "results"


def _entry(seeds, bleus, losses, attempts=None, seconds=None, resumes=None):
    return {"seeds": list(seeds), "bleu_per_seed": list(bleus), "valid_loss_per_seed": list(losses),
            "status_per_seed": ["ok"] * len(seeds), "train_seconds_per_seed": seconds or [600.0] * len(seeds),
            "attempts_per_seed": attempts or [1] * len(seeds),
            "resumes_per_seed": resumes or [0 if a == 1 else None for a in attempts or [1] * len(seeds)]}


def _grid():
    """Two rates; at 2e-3 RealFormer has the best BLEU but the worse valid loss (so BLEU would
    choose 2e-3, the loss chooses 1e-3); seeds 4-5 only at 1e-3."""
    return {
        "0.002": add_seed_paired({
            "postln": _entry([1, 2, 3], [20.0, 21.0, 22.0], [5.5, 5.5, 5.5]),
            "realformer": _entry([1, 2, 3], [30.0, 31.0, 29.0], [5.4, 5.4, 5.4]),
            "preln": _entry([1, 2, 3], [28.0, 28.5, 29.0], [4.8, 4.8, 4.8])}),
        "0.001": add_seed_paired({
            "postln": _entry([1, 2, 3, 4, 5], [22.0, 22.5, 23.0, 21.0, 22.0], [5.3, 5.3, 5.3, 5.3, 5.3]),
            "realformer": _entry([1, 2, 3, 4, 5], [25.0, 26.0, 24.5, 25.5, 26.5], [5.2, 5.2, 5.2, 5.2, 5.2],
                                 attempts=[1, 3, 1, 2, None], resumes=[0, 1, 0, 0, None]),
            "preln": _entry([1, 2, 3, 4, 5], [27.0, 27.5, 27.0, 26.0, 28.0], [5.0, 5.0, 5.0, 5.0, 5.0])}),
    }


def test_best_rate_is_chosen_by_valid_loss_on_the_seeds_run_at_every_rate():
    grid = _grid()
    best = stability.best_rates(grid)
    rf = best["backbones"]["realformer"]
    assert rf["lr"] == 0.001 and rf["selection_seeds"] == [1, 2, 3]  # BLEU would have chosen 2e-3
    assert best["backbones"]["preln"]["lr"] == 0.002
    pair = next(p for p in best["pairs"] if p["reference"] == "preln")
    # realformer at 1e-3 (seeds 1-5) against preln at 2e-3 (seeds 1-3): the common seeds only
    assert pair["seed_paired"]["seeds"] == [1, 2, 3]
    assert pair["seed_paired"]["per_seed"] == pytest.approx([-3.0, -2.5, -4.5])
    assert pair["seed_paired_unselected"]["per_seed"] == []  # every common seed chose the rates
    post = next(p for p in best["pairs"] if p["reference"] == "postln")
    assert post["lr"] == post["reference_lr"] == 0.001
    assert post["seed_paired"]["seeds"] == [1, 2, 3, 4, 5]
    assert post["seed_paired_unselected"]["seeds"] == [4, 5]
    assert post["seed_paired_unselected"]["per_seed"] == pytest.approx([4.5, 4.5])


def test_intervals_are_corrected_for_the_rates_and_only_the_corrected_one_decides_bold():
    grid = _grid()
    stability.add_corrected(grid)
    record = grid["0.001"]["realformer"]["seed_paired_vs_postln"]
    per_seed = record["per_seed"]
    half = t.ppf(1 - 0.025 / 2, len(per_seed) - 1) * statistics.stdev(per_seed) / len(per_seed) ** 0.5
    mean = statistics.mean(per_seed)
    assert record["corrected_for"] == 2
    assert record["ci95_corrected"] == pytest.approx([mean - half, mean + half], abs=0.006)
    low, high = record["ci95"]
    assert record["ci95_corrected"][0] < low and high < record["ci95_corrected"][1]
    # a record whose 95% interval clears zero but whose corrected one does not is not bold
    rec = {"seeds": [1, 2, 3], "per_seed": [4.66, 3.67, 7.81], "mean": 5.38, "sd": 2.16, "ci95": [0.01, 10.75]}
    row = {"0.002": {"realformer": {"seed_paired_vs_postln": dict(rec)}}, "0.001": {}, "0.004": {}, "0.008": {}}
    stability.add_corrected(row)
    cell = stability.seed_paired_cell(row["0.002"]["realformer"], "seed_paired_vs_postln")
    assert "corrected for 4 rates -5.68 to +16.44" in cell and "**" not in cell
    assert "**" in stability.seed_paired_cell({"seed_paired_vs_postln": rec}, "seed_paired_vs_postln")


def test_summary_fills_a_grid_row_only_where_the_corrected_interval_clears_zero():
    data = json.loads((RESULTS / "lr_limit_depth6.json").read_text())
    rows = summary.rows_of(data, "stability", "lr_limit_depth6")
    for row in rows:
        for cell in row["cells"]:
            if cell is None or not cell.get("ci95"):
                continue
            assert cell["family"] == len(data["lrs"]) and cell["family_word"] == "rates"
            low, high = summary.corrected(cell)
            assert [round(low, 2), round(high, 2)] == cell["ci95_corrected"]
            assert f"{len(data['lrs'])} rates, corrected" in summary.cell_text(cell)


def test_wall_time_table_names_resumed_runs_and_unrecorded_ones():
    grid = _grid()
    data = {"lrs": [0.002, 0.001], "backbones": ["postln", "realformer", "preln"], "grid": grid}
    lines = stability.wall_time_lines(data)
    rf = next(line for line in lines if line.startswith("| 0.001 | realformer |"))
    # seed 2: three attempts, one of them from its checkpoint; seed 4: started again from update 0
    assert rf == ("| 0.001 | realformer | 1, 2, 3, 4, 5 | 10, 10, 10, 10, 10 | seeds [2]; not recorded for seeds [5] "
                  "| seeds [4]; not recorded for seeds [5] |")
    post = next(line for line in lines if line.startswith("| 0.002 | postln |"))
    assert post.endswith("| none | none |")


def test_a_resume_is_a_checkpoint_fairseq_loaded_and_a_restart_from_update_0_is_not(tmp_path):
    """``resumes``: the times fairseq's log says it loaded the run's own checkpoint_last.pt at a
    later update; an attempt that found no checkpoint started the run again. A record from
    before the field is counted from its log."""
    from realformer_tools.experiments import fairseq_runs
    from realformer_tools.experiments.translation.stats import resumes

    lines = ["2026-12-02 05:07:27 | INFO | fairseq.trainer | No existing checkpoint found runs/x/checkpoint_last.pt",
             "2026-12-02 05:32:34 | INFO | fairseq.trainer | No existing checkpoint found runs/x/checkpoint_last.pt"]
    assert fairseq_runs.resumes_in_log(lines) == 0
    lines.append("2026-12-02 04:58:41 | INFO | fairseq.trainer | Loaded checkpoint runs/x/checkpoint_last.pt "
                 "(epoch 5 @ 1020 updates)")
    lines.append("| INFO | fairseq.checkpoint_utils | Loaded checkpoint /tmp/pretrained.pt (epoch 3 @ 40 updates)")
    assert fairseq_runs.resumes_in_log(lines) == 1
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    assert resumes({"attempts": 3, "log": str(log)}) == 1
    assert resumes({"attempts": 1, "log": str(tmp_path / "gone.log")}) == 0
    assert resumes({"attempts": 2, "log": str(tmp_path / "gone.log")}) is None
    assert resumes({"attempts": None}) is None and resumes({"attempts": 2, "resumes": 0}) == 0


def test_committed_grid_report_carries_the_best_rate_comparison():
    """The committed JSON's best-rate record is what its grid gives (recomputed here)."""
    data = json.loads((RESULTS / "lr_limit_depth6.json").read_text())
    assert data["best_rate"] == json.loads(json.dumps(stability.best_rates(data["grid"])))
    md = (RESULTS / "lr_limit_depth6.md").read_text()
    assert "## Each backbone at its best learning rate" in md and "## Wall time of every run, and resumes" in md


def test_cells_name_the_grid_cells_that_train_and_bad_ones_are_one_line(capsys):
    from realformer_tools.cli import compare_backbones as cli

    base = ["--data", "d", "--out", "o", "--stability-limit", "--depths", "6", "--lrs", "1e-3,2e-3,4e-3",
            "--backbones", "postln,realformer,preln", "--seeds", "4,5"]
    args = cli.parse_args(base + ["--cells", "2e-3:postln,0.002:realformer,4e-3:preln"])
    assert args.cells == {(2e-3, "postln"), (2e-3, "realformer"), (4e-3, "preln")}
    assert stability._in_cells((0.002, "postln"), args.cells) and not stability._in_cells((1e-3, "postln"), args.cells)
    for bad, said in (("8e-3:postln", "is not one of --lrs"), ("2e-3:realformer_preln", "is not one of --backbones"),
                      ("postln", "is not LR:BACKBONE")):
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(base + ["--cells", bad])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--data", "d", "--out", "o", "--cells", "1e-3:postln"])
    assert "--cells applies to --stability-limit only" in capsys.readouterr().err


def test_a_grid_with_cells_says_which_cells_have_which_seeds():
    data = json.loads((RESULTS / "lr_limit_depth6.json").read_text())
    cells = data["recipe"].get("cells")
    line = stability._seeds_line(data)
    if cells:  # the ten-seed cells of the committed study
        assert f"asked for in {len(cells)} cells" in line and "each cell lists its own" in line
    data["recipe"]["cells"] = [{"lr": 0.002, "backbone": "realformer"}]
    assert "asked for in 1 cells (realformer at 0.002)" in stability._seeds_line(data)
    del data["recipe"]["cells"]
    assert stability._seeds_line(data) == f"seeds {data['recipe']['seeds']}"
