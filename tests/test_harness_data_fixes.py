"""The comparison harness trains and decodes every backbone with the data fixes on
(``REALFORMER_NMT_DATA_FIXES=1``), records that in each results JSON and run, takes the
committed results (recorded before the switch existed, when the fixes were always on) as
on, and refuses to mix runs made with the switch off. No training here: the fairseq runs
are replaced by recorders of what they were given."""

import json
import os

import pytest
from conftest import REPO

from realformer_nmt.errors import ConfigError
from realformer_tools.experiments import compare, fairseq_runs
from realformer_tools.experiments.translation import imports, runs
from realformer_tools.launch import DATA_FIXES_ENV as SWITCH

COMMITTED = REPO / "results" / "multi30k_en_de.json"


def _committed_recipe():
    summary = json.loads(COMMITTED.read_text())
    return summary, compare.Recipe(**summary["recipe"]["settings"])


def test_runs_train_and_decode_with_the_switch_on_whatever_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(SWITCH, "0")  # the caller's environment says off: the harness still turns it on
    seen = {}

    def train(cmd, run_dir, label, log, max_update, env):
        seen["train"], seen["train_command"] = env, [str(c) for c in cmd]
        open(os.path.join(run_dir, "checkpoint_best.pt"), "wb").close()
        return {"status": "finished", "reason": None, "seconds": 1.0, "updates": 4,
                "curve": [{"update": 4, "loss": 3.0}], "command": [str(c) for c in cmd], "log": "x"}

    def generate(*args, env=None, **kwargs):
        seen["generate"] = env
        return {"bleu": 1.0, "sacrebleu": "BLEU = 1.0", "signature": "s", "convention": "sacrebleu",
                "seconds": 1.0, "command": ["fairseq-generate"]}

    monkeypatch.setattr(fairseq_runs, "train_resumable", train)
    monkeypatch.setattr(fairseq_runs, "generate_and_score", generate)
    run_dir = tmp_path / "postln" / "seed1"
    run_dir.mkdir(parents=True)
    result = runs.run_one(str(tmp_path / "data"), "refs", "postln", compare.Recipe(max_update=4), 1, str(run_dir),
                          log=lambda m: None)
    assert seen["train"][SWITCH] == "1" and seen["generate"][SWITCH] == "1"
    assert seen["train_command"][1:4] == ["-m", "realformer_tools.launch", "fairseq-train"]  # the fixes to fairseq
    assert result["environment"] == {SWITCH: "1"}
    assert json.loads((run_dir / "result.json").read_text())["environment"] == {SWITCH: "1"}

    record = runs.recipe_record(compare.Recipe(), str(tmp_path / "data"), __file__, ["postln"], "sum", [1])
    assert record["environment"] == {SWITCH: "1"}


def test_a_run_recorded_with_the_switch_off_is_not_mixed_in(tmp_path):
    recipe = compare.Recipe(max_update=4)
    run_dir = tmp_path / "postln" / "seed1"
    run_dir.mkdir(parents=True)
    cmd = runs.train_command(str(tmp_path / "data"), "postln", recipe, 1, str(run_dir))
    result = {"command": cmd, "status": "finished", "bleu": 1.0}
    (run_dir / "result.json").write_text(json.dumps(result))
    assert runs.finished_run(str(tmp_path / "data"), "postln", recipe, 1, str(run_dir)) is not None  # none recorded: on
    (run_dir / "result.json").write_text(json.dumps(dict(result, environment={SWITCH: "0"})))
    with pytest.raises(ConfigError, match=f"{SWITCH}='0' where this harness trains every backbone with {SWITCH}=1"):
        runs.finished_run(str(tmp_path / "data"), "postln", recipe, 1, str(run_dir))


def test_committed_results_recorded_without_the_switch_import_as_on(tmp_path):
    summary, recipe = _committed_recipe()
    summary["recipe"].pop("environment", None)  # as the files written before the switch existed are
    old = tmp_path / "old.json"
    old.write_text(json.dumps(summary))
    data = tmp_path / os.path.basename(summary["recipe"]["data"])
    records = imports.run_records(str(old), str(data), str(tmp_path / "out"), recipe)
    assert records and all(record["environment"] == {SWITCH: "1"} for record, _ in records.values())


def test_results_recorded_with_the_switch_off_are_refused(tmp_path):
    summary, recipe = _committed_recipe()
    summary["recipe"]["environment"] = {SWITCH: "0"}
    off = tmp_path / "off.json"
    off.write_text(json.dumps(summary))
    data = tmp_path / os.path.basename(summary["recipe"]["data"])
    with pytest.raises(ConfigError, match=f"--import-results {off}: its runs were trained with {SWITCH}='0'"):
        imports.import_results(str(off), str(data), str(tmp_path / "out"), recipe, log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_the_masked_lm_comparison_trains_with_the_switch_on(tmp_path, monkeypatch):
    from realformer_tools.experiments import mlm_compare

    monkeypatch.setenv(SWITCH, "0")
    (tmp_path / "dict.txt").write_text("a 1\n")
    seen = []

    class Stop(Exception):
        pass

    def run_one(data, backbone, recipe, seed, run_dir, residual_mode, env, log):
        seen.append(env)
        raise Stop

    monkeypatch.setattr(mlm_compare, "run_one", run_one)
    with pytest.raises(Stop):
        mlm_compare.compare(str(tmp_path), str(tmp_path / "out"), mlm_compare.MLMRecipe(), backbones=("postln",),
                            log=lambda m: None)
    assert seen and seen[0][SWITCH] == "1"
