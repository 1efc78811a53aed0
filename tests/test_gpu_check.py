"""``make gpu-check``'s dry run (CPU, toy sizes): it runs, writes its JSON, and resumes."""

import json
import os
import subprocess
import sys

import pytest

from realformer_nmt.experiments import gpu_check, kernel_timing

from conftest import REPO

ARGS = ["--dry-run", "--steps", "train,speed", "--kernels", "materialized", "--precisions", "fp32,fp16"]


def strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "out"
    code = gpu_check.main([*ARGS, "--out", str(out)])
    return out, code


def test_dry_run_passes_and_writes_every_chosen_step(dry_run):
    out, code = dry_run
    assert code == 0
    assert sorted(p.name for p in out.glob("*.json")) == [
        "kernel_rule.json", "speed.json", "speed_bfloat16.json", "speed_float16.json", "train.json"]
    summary = (out / "summary.md").read_text()
    assert "| train | passed |" in summary and "| speed | passed |" in summary
    assert "| tests | not run |" in summary


def test_train_step_trains_decodes_and_reports_cuda_only_precisions_as_skipped(dry_run):
    out, _ = dry_run
    train = json.loads((out / "train.json").read_text())
    assert train["status"] == "passed" and train["dry_run"] is True
    runs = {c["name"]: c for c in train["checks"]}
    assert set(runs) == {"fp32/materialized", "fp16/materialized"}
    fp32 = runs["fp32/materialized"]
    assert fp32["status"] == "passed" and fp32["updates"] == gpu_check.DRY.train_updates
    losses = [loss for _, loss in fp32["train_losses"]]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert fp32["generate"]["status"] == "passed"
    assert fp32["generate"]["hypotheses"] == fp32["generate"]["sentences"] == 50
    assert runs["fp16/materialized"]["status"] == "skipped"
    assert "CUDA only" in runs["fp16/materialized"]["reason"]


def test_speed_step_writes_tables_and_a_kernel_rule_in_the_agreed_schema(dry_run):
    out, _ = dry_run
    for dtype in ("float16", "bfloat16"):
        speed = json.loads((out / f"speed_{dtype}.json").read_text())
        assert [(c["size"], c["length"]) for c in speed["configs"]] == [("toy", 8), ("toy", 16)]
        assert set(speed["configs"][0]["variants"]) == {"vanilla", "materialized"}
    rule = json.loads((out / "kernel_rule.json").read_text())
    assert set(rule) == {"device", "dtype", "rule", "measured", "command"}
    assert rule["device"] == "cpu" and rule["dtype"] == "float16"
    assert set(rule["rule"]) == {"first_layer", "later_layers"}
    assert all(k in kernel_timing.CONCRETE_KERNELS for k in rule["rule"].values())
    assert rule["command"].startswith("python scripts/benchmark_kernels.py --device cpu --dtype float16")
    chosen = rule["measured"]["chosen"]
    assert kernel_timing.split_variant(chosen, 3) == (rule["rule"]["first_layer"], rule["rule"]["later_layers"])


def test_step_json_has_no_machine_paths(dry_run):
    out, _ = dry_run
    for path in out.glob("*.json"):
        found = [s for s in strings(json.loads(path.read_text())) if s.startswith("/") or sys.executable in s]
        assert not found, (path.name, found[:3])


def test_second_call_keeps_finished_steps(dry_run, capsys):
    out, _ = dry_run
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert gpu_check.main([*ARGS, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "train: done earlier (passed), kept" in err and "speed: done earlier (passed), kept" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")} == before


def test_dry_run_refuses_the_real_results_folder(capsys):
    assert gpu_check.main(["--dry-run", "--steps", "speed", "--out", os.path.join(REPO, "results", "gpu")]) == 2
    assert "another --out" in capsys.readouterr().err


def test_without_cuda_the_real_check_says_how_to_run(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert gpu_check.main(["--steps", "speed", "--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_make_gpu_check_is_a_front_over_the_module():
    proc = subprocess.run(["make", "-n", "gpu-check", "PY=python", "GPU_CHECK_ARGS=--dry-run"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == ["python -m realformer_nmt.experiments.gpu_check --dry-run"]
