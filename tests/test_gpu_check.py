"""``make gpu-check``'s dry run (CPU, toy sizes): it runs, writes its JSON, and resumes."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, cli_env

from realformer_tools.experiments import gpu_check, kernel_timing

# every step, as CI must prove them; one kernel (bias, what auto runs on CUDA) keeps it short
ARGS = ["--dry-run", "--steps", "tests,train,ddp,speed", "--kernels", "bias", "--precisions", "fp32,fp16"]


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
    """The dry run through the documented front: ``make gpu-check GPU_CHECK_ARGS=--dry-run ...``
    (``PY``: this interpreter, so make sets nothing up)."""
    root = tmp_path_factory.mktemp("gpu")
    out = root / "out"
    args = " ".join([*ARGS, "--out", str(out), "--work", str(root / "work")])
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PY={sys.executable}",
                           f"GPU_CHECK_ARGS={args}"], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=1200)
    return out, proc


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_dry_run_passes_and_writes_every_step(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("*.json")) == [
        "ddp.json", "kernel_rule.json", "speed.json", "speed_bfloat16.json", "speed_float16.json", "tests.json",
        "train.json"]
    summary = (out / "summary.md").read_text()
    for step in ("tests", "train", "ddp", "speed"):
        assert f"| {step} | passed |" in summary, summary


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_tests_step_ran_the_gpu_tests_cpu_cases_and_skipped_the_cuda_ones(dry_run):
    out, _ = dry_run
    tests = json.loads((out / "tests.json").read_text())
    (pytest_check,) = tests["checks"]
    assert pytest_check["status"] == "passed", pytest_check
    counts = pytest_check["counts"]
    assert counts["passed"] > 0 and counts["failed"] == counts["errors"] == 0
    assert counts["skipped"] > 0 and "CUDA" in pytest_check["reason"]


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_ddp_step_trains_two_ranks_with_both_backends(dry_run):
    out, _ = dry_run
    ddp = json.loads((out / "ddp.json").read_text())
    checks = {c["backend"]: c for c in ddp["checks"] if "backend" in c}
    assert set(checks) == {"pytorch_ddp", "legacy_ddp"}
    (fp16,) = [c for c in ddp["checks"] if c["name"] == "--fp16 ranks"]
    assert fp16["status"] == "skipped" and "CUDA" in fp16["reason"]
    exits = [c for c in ddp["checks"] if c["name"].endswith("exit after training")]
    assert len(exits) == 2 and all(c["status"] == "reported" for c in exits)
    for c in checks.values():
        assert c["status"] == "passed", c
        assert c["returncodes"] == [0, 0] and c["devices"] == 2
        # every rank saved its own checkpoint: both at max_update, equal bit for bit
        assert c["rank0_updates"] == c["rank1_updates"] == gpu_check.DRY.ddp_updates
        assert c["parameters_equal"] is True
        losses = [loss for _, loss in c["train_losses"]]
        assert losses[-1] < losses[0]


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_train_step_trains_decodes_and_reports_cuda_only_precisions_as_skipped(dry_run):
    out, _ = dry_run
    train = json.loads((out / "train.json").read_text())
    assert train["status"] == "passed" and train["dry_run"] is True
    runs = {c["name"]: c for c in train["checks"]}
    # vanilla: the yardstick of the precision judgement over seeds
    assert set(runs) == {"fp32/bias", "fp16/bias", "fp32/vanilla", "fp16/vanilla"}
    fp32 = runs["fp32/bias"]
    assert fp32["status"] == "passed" and fp32["updates"] == gpu_check.DRY.train_updates
    losses = [loss for _, loss in fp32["train_losses"]]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert fp32["generate"]["status"] == "passed"
    assert fp32["generate"]["hypotheses"] == fp32["generate"]["sentences"] == 50
    assert runs["fp16/bias"]["status"] == "skipped"
    assert "CUDA only" in runs["fp16/bias"]["reason"]


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_speed_step_writes_tables_and_a_kernel_rule_in_the_agreed_schema(dry_run):
    out, _ = dry_run
    for dtype in ("float16", "bfloat16"):
        speed = json.loads((out / f"speed_{dtype}.json").read_text())
        assert [(c["size"], c["length"]) for c in speed["configs"]] == [("toy", 8), ("toy", 16)]
        assert set(speed["configs"][0]["variants"]) == {"vanilla", "bias"}
    rule = json.loads((out / "kernel_rule.json").read_text())
    assert set(rule) == {"device", "dtype", "rule", "measured", "command"}
    assert rule["device"] == "cpu" and rule["dtype"] == "float16"
    assert set(rule["rule"]) == {"first_layer", "later_layers"}
    assert all(k in kernel_timing.CONCRETE_KERNELS for k in rule["rule"].values())
    assert rule["command"].startswith("python scripts/benchmark_kernels.py --device cpu --dtype float16")
    chosen = rule["measured"]["chosen"]
    assert kernel_timing.split_variant(chosen, 3) == (rule["rule"]["first_layer"], rule["rule"]["later_layers"])


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_step_json_has_no_machine_paths(dry_run):
    out, _ = dry_run
    for path in out.glob("*.json"):
        found = [s for s in strings(json.loads(path.read_text())) if s.startswith("/") or sys.executable in s]
        assert not found, (path.name, found[:3])


@pytest.mark.slow  # the dry run trains (fairseq-train, two DDP ranks)
def test_second_call_keeps_finished_steps(dry_run, capsys):
    out, _ = dry_run
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert gpu_check.main([*ARGS, "--out", str(out), "--work", str(out.parent / "work")]) == 0
    err = capsys.readouterr().err
    for step in ("tests", "train", "ddp", "speed"):
        assert f"{step}: done earlier (passed), kept" in err
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
    # --no-print-directory: under `make test` (CI) the inner make would add "Entering directory" lines
    proc = subprocess.run(["make", "-n", "--no-print-directory", "gpu-check", "PY=python",
                           "GPU_CHECK_ARGS=--dry-run"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == ["python -m realformer_tools.experiments.gpu_check --dry-run"]
