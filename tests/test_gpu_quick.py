"""``make gpu-check GPU_CHECK_ARGS=--quick``: the one short command a GPU user runs first
(issue 23). On this CPU machine its dry run (``--quick --dry-run``) runs the same code at toy
sizes; the checks it makes are shown able to fail; the ``ddp`` step keeps inside its cap."""

import json
import subprocess
import sys
import types

import pytest
import torch
from conftest import REPO, cli_env
from test_gpu_check import strings

from realformer_nmt.modules import residual_attention as ra
from realformer_tools.experiments import exactness, gpu_check

TOY = dict(layers=2, embed=16, heads=4, vocab=30, batch=3, src_len=8, tgt_len=6)
MODES = ("sum", "mean")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The documented command, ``make gpu-check GPU_CHECK_ARGS="--quick --dry-run"`` (plus
    ``--out`` / ``--work`` in a temporary folder)."""
    root = tmp_path_factory.mktemp("quick")
    out = root / "out"
    args = f"--quick --dry-run --out {out} --work {root / 'work'}"
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PY={sys.executable}",
                           f"GPU_CHECK_ARGS={args}"], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=1500)
    return out, proc


@pytest.mark.slow  # the quick dry run trains (fairseq-train, two DDP ranks)
def test_quick_dry_run_writes_quick_json_and_summary_md_only(quick):
    out, proc = quick
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["quick.json", "summary.md"]
    record = json.loads((out / "quick.json").read_text())
    assert record["quick"] is True and record["dry_run"] is True and record["status"] == "passed"
    assert list(record["sections"]) == list(gpu_check.QUICK_SECTIONS)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU quick check (dry run")
    for section in gpu_check.QUICK_SECTIONS:
        assert f"| {section} | passed |" in summary, summary
    found = [s for s in strings(record) if s.startswith("/") or sys.executable in s]
    assert not found, found[:3]


@pytest.mark.slow
def test_quick_exactness_is_judged_by_float64_and_yardsticks_per_parameter_tensor(quick):
    out, _ = quick
    sec = json.loads((out / "quick.json").read_text())["sections"]["exactness"]
    judged = [c for c in sec["checks"] if "limit_output" in c]
    assert {(c["kernel"], c["model"], c["mode"]) for c in judged} == {
        (k, v.name, m) for k in ("bias", "fused", "auto") for v in exactness.VARIANTS for m in v.modes}
    layers = gpu_check.QUICK_DRY.exact["layers"]
    for c in judged:
        assert c["status"] == "passed", c
        assert c["output_relative"] <= c["limit_output"] and c["max_relative"] <= c["limit_gradient"]
        assert set(c["yardsticks"]) == {"materialized", "fairseq"}
        assert c["q_k_projections"] == 2 * 3 * layers  # q and k of encoder self, decoder self, cross
        assert c["zero_gradient_tensors"] == 3 * layers  # the k_proj biases
        assert (c["relu_flips"] is None) == (c["activation"] == "gelu")
    proof = [c for c in sec["checks"] if c.get("tolerance") == exactness.FLOAT64_TOLERANCE]
    assert {(c["kernel"], c["mode"]) for c in proof} == {(k, m) for k in ("bias", "fused", "auto") for m in MODES}
    assert all(c["status"] == "passed" and max(c["output_relative"], c["max_relative"]) < 1e-10 for c in proof)
    halves = [c for c in sec["checks"] if "distances" in c]
    assert {c["dtype"] for c in halves} == {"float16", "bfloat16"} and all(c["status"] == "reported" for c in halves)
    assert all(set(c["distances"]) == {"materialized", "bias", "fused", "auto", "fairseq"} for c in halves)
    (mask,) = [c for c in sec["checks"] if "relative_errors" in c]
    assert mask["status"] == "passed" and mask["relative_errors"]["mask_gradient"] <= 1e-4
    (backend,) = [c for c in sec["checks"] if "forward" in c]
    # on the CPU the bias layer's SDPA call (a mask with a gradient) is the math kernel
    assert backend["forward"]["backends"] == ["MATH"]
    assert "aten::_scaled_dot_product_attention_math" in backend["forward"]["ops"]


@pytest.mark.slow
def test_quick_train_speed_and_ddp_in_the_dry_run(quick):
    out, _ = quick
    record = json.loads((out / "quick.json").read_text())
    sections = record["sections"]
    assert set(record["reserved_seconds"]) == set(gpu_check.QUICK_SECTIONS)
    assert sum(gpu_check.QUICK_REAL.reserve.values()) <= gpu_check.QUICK_SECONDS - 10
    runs = {c["name"]: c for c in sections["train"]["checks"]}
    for kernel in gpu_check.QUICK_KERNELS:
        assert runs[f"fp16/{kernel}"]["status"] == "skipped"
    for kernel in gpu_check.QUICK_DRY_KERNELS:
        assert "CUDA" in runs[f"fp16/{kernel}"]["reason"]
    for name in ("fp32/vanilla", "fp32/bias", "bf16/vanilla", "bf16/bias"):
        run = runs[name]
        assert run["status"] == "passed" and run["updates"] == gpu_check.QUICK_DRY.train_updates
        assert run["generate"]["status"] == "passed"
    assert "--arch transformer" in runs["fp32/vanilla"]["command"]
    bf16 = runs["bf16 trained: valid loss against fp32's (bias)"]
    assert bf16["status"] == "reported"
    assert bf16["relative"] == pytest.approx(abs(bf16["valid_loss"] - bf16["fp32_valid_loss"]) /
                                             bf16["fp32_valid_loss"])
    # the judged precision cost: the fp32 checkpoints evaluated in fp16 / bf16, against vanilla's
    shifts = {(c["dtype"], c["kernel"]): c for c in sections["train"]["checks"] if "shift" in c}
    assert set(shifts) == {(d, k) for d in ("float16", "bfloat16") for k in gpu_check.QUICK_DRY_KERNELS}
    bias = shifts[("bfloat16", "bias")]
    assert bias["shift"] == pytest.approx(abs(bias["nll"] - bias["fp32_nll"]) / bias["fp32_nll"])
    assert bias["limit"] == pytest.approx(max(0.005, 1.5 * shifts[("bfloat16", "vanilla")]["shift"]))
    assert bias["status"] == "passed"  # judged on the CPU too: the same casts of a toy model
    assert bias["tokens"] > 0 and bias["fp32_nll"] > 0
    table = next(c["table"] for c in sections["speed"]["checks"] if c.get("table"))
    assert {r["variant"] for r in table} == {"vanilla", "materialized", "fused", "bias", "triton", "auto"}
    assert all(r["rounds"] >= gpu_check.SPEED_MIN_ALTERNATIONS for r in table)
    assert all(r["train_speed_low"] <= r["train_speed_ratio"] <= r["train_speed_high"] for r in table)
    ddp = {c["name"]: c for c in sections["ddp"]["checks"]}
    ranks = ddp["pytorch_ddp x2 (fp32, gloo)"]
    assert ranks["status"] == "passed", ranks
    assert ranks["rank0_updates"] == ranks["rank1_updates"] == gpu_check.QUICK_DRY.ddp_updates
    assert ranks["parameters_equal"] is True and ranks["tensors_compared"] > 0
    exit_check = ddp["pytorch_ddp x2: exit after training"]  # timed, or stopped as a slow exit: reported
    assert exit_check["status"] == "reported"
    assert exit_check["exit_seconds"] is not None or exit_check["stopped"] == "slow exit"


@pytest.mark.slow
def test_quick_dry_run_calls_passed_only_what_it_judged_and_says_what_ran(quick):
    """Issue 36: the dry run called the SDPA backend (no op recorded backward) and bf16's
    distance to fp32 ("reported, not judged") passed, and headed its CPU/gloo ranks "two
    ranks on one GPU"."""
    out, _ = quick
    record = json.loads((out / "quick.json").read_text())
    checks = [c for sec in record["sections"].values() for c in sec["checks"]]
    assert not [c["name"] for c in checks if c["status"] == "passed" and "not judged" in (c["reason"] or "")]
    (backend,) = [c for c in record["sections"]["exactness"]["checks"] if "forward" in c]
    assert backend["status"] == "reported" and backend["backward"]["backends"] == ["no SDPA op recorded"]
    agreement = [c for c in record["sections"]["train"]["checks"] if c["name"].startswith("bf16 trained")]
    judged = [c for c in agreement if c["status"] != "skipped"]
    assert judged and all(c["status"] == "reported" for c in judged)
    for name, sec in record["sections"].items():
        assert "the CPU (dry run" in sec["ran"] and "GPU" not in sec["ran"], (name, sec["ran"])
    assert "gloo, fp32, pytorch_ddp" in record["sections"]["ddp"]["ran"]
    summary = (out / "summary.md").read_text()
    assert "one GPU" not in summary and "two fairseq-train ranks on the CPU" in summary


# --------------------------------------------------------------------------------------
# statuses: passed / failed only for what was judged (no training)
# --------------------------------------------------------------------------------------


def test_a_status_counts_judged_checks_only():
    def checks(*statuses):
        return [gpu_check.check(f"c{i}", s) for i, s in enumerate(statuses)]

    assert gpu_check.step_status(checks("passed", "reported", "skipped")) == "passed"
    assert gpu_check.step_status(checks("reported", "skipped")) == "reported"  # nothing judged: not passed
    assert gpu_check.step_status(checks("skipped", "skipped")) == "skipped"
    assert gpu_check.step_status(checks("passed", "failed", "reported")) == "failed"


def test_sdpa_backend_is_judged_on_cuda_only():
    record = {phase: dict(backends=["no SDPA op recorded"], ops={}, device_kernels={})
              for phase in ("forward", "backward")}
    assert exactness.check_backends(record, "cpu")["status"] == "reported"
    assert exactness.check_backends(record, "cuda")["status"] == "failed"
    record = {phase: dict(backends=["EFFICIENT_ATTENTION"], ops={}, device_kernels={})
              for phase in ("forward", "backward")}
    assert exactness.check_backends(record, "cuda")["status"] == "passed"
    assert exactness.check_backends(record, "cpu")["status"] == "reported"


def test_trained_half_precision_runs_are_reported_not_judged(tmp_path):
    """One seed of 300 updates cannot judge 1%: fairseq's own transformer ended 6.28% from
    fp32 in bf16 on the H100; the trained comparison is reported on CUDA too."""
    for dry in (True, False):
        ctx = gpu_check.GpuCheck(out=str(tmp_path / f"out{dry}"), work=str(tmp_path / f"w{dry}"), dry_run=dry)
        runs = [dict(name=f"{p}/{k}", status="passed", precision=p, kernel=k, valid_loss=loss)
                for k in gpu_check.QUICK_KERNELS for p, loss in (("fp32", 4.0), ("bf16", 4.4))]
        name = "bf16 trained: valid loss against fp32's (bias)"
        (row,) = [c for c in ctx.precision_agreement(runs) if c["name"] == name]
        assert row["status"] == "reported" and row["relative"] == pytest.approx(0.1)
        assert "vanilla's 10.00%" in row["reason"]
        assert gpu_check.step_status([row]) == "reported"


def test_sections_and_steps_say_what_ran(tmp_path):
    dry = gpu_check.GpuCheck(out=str(tmp_path / "dry"), work=str(tmp_path / "w1"), dry_run=True)
    real = gpu_check.GpuCheck(out=str(tmp_path / "real"), work=str(tmp_path / "w2"), dry_run=False)
    ranks = [gpu_check.check("pytorch_ddp x2", "passed", backend="pytorch_ddp", precision=p) for p in ("fp32", "fp16")]
    assert dry.what_ran("ddp", ranks[:1], gpu_check.QUICK_DRY) == (
        f"two fairseq-train ranks on the CPU (dry run, toy sizes) over gloo, fp32, pytorch_ddp, "
        f"{gpu_check.QUICK_DRY.ddp_updates} updates")
    assert real.what_ran("ddp", ranks[1:]).startswith("two fairseq-train ranks on one CUDA GPU over gloo, fp16")
    trained = [gpu_check.check("fp32/bias", "passed"), gpu_check.check("fp16/bias", "skipped", "CUDA only")]
    assert "on the CPU (dry run, toy sizes): fp32/bias;" in dry.what_ran("train", trained)
    record = {"dry_run": True, "sections": {"ddp": {"status": "passed", "seconds": 1.0, "checks": ranks[:1],
                                                    "ran": dry.what_ran("ddp", ranks[:1], gpu_check.QUICK_DRY)}}}
    text = gpu_check.quick_markdown(record)
    assert "on one GPU" not in text and "| ddp | passed | 1 | two fairseq-train ranks on the CPU" in text


# --------------------------------------------------------------------------------------
# the checks can fail (no training)
# --------------------------------------------------------------------------------------


def _judged(checks, kernel):
    return [c for c in checks if c.get("kernel") == kernel and "limit_output" in c]


@pytest.mark.slow  # two float32 / float64 comparisons of the peaked model (10 s or more)
def test_exactness_fails_a_kernel_whose_residual_path_lost_its_gradient(monkeypatch):
    real = ra.bias._additive_bias

    def detached(prev, *args):  # the bias kernel with the mask's gradient dropped (a cuDNN-like backend)
        return real(prev.detach(), *args)

    monkeypatch.setattr(ra.bias, "_additive_bias", detached)
    checks = exactness.model_agreement("cpu", TOY, log=lambda m: None, variants=exactness.VARIANTS[:1])
    bias = _judged(checks, "bias")
    assert bias and all(c["status"] == "failed" for c in bias)
    assert any("worst gradient" in p for c in bias for p in c["problems"])
    monkeypatch.setattr(ra.bias, "_additive_bias", real)
    checks = exactness.model_agreement("cpu", TOY, log=lambda m: None, variants=exactness.VARIANTS[:1])
    assert all(c["status"] == "passed" for c in checks if "limit_output" in c)


def _noisy_bias(eps):
    """The bias kernel with its additive bias perturbed by ``eps`` relative noise (fixed seed):
    the same function, computed less accurately."""
    real = ra.bias._additive_bias

    def noisy(prev, *args):
        bias = real(prev, *args)
        noise = torch.randn(bias.shape, generator=torch.Generator().manual_seed(0)).to(bias)
        real_scores = torch.isfinite(bias) & (bias > torch.finfo(bias.dtype).min / 2)  # not the masks' fill
        return torch.where(real_scores, bias + eps * noise * bias.detach().abs(), bias)

    return noisy


@pytest.mark.slow  # every model variant, float32 and float64 (10 s or more)
def test_a_kernel_ten_times_less_accurate_than_materialized_fails(monkeypatch):
    """Issue 51: the float32 judgement against float64 with yardsticks from the same run
    passes the kernels as they are and fails one made 10x less accurate than materialized,
    on every model, though the same kernel is closer to materialized than the 1e-4 the first
    yardstick allowed."""
    monkeypatch.setattr(ra.bias, "_additive_bias", _noisy_bias(1.5e-5))
    checks = exactness.model_agreement("cpu", TOY, log=lambda m: None)
    yard = {(c["model"], c["mode"]): c for c in checks if c.get("kernel") == "materialized"}
    for c in _judged(checks, "bias"):
        mat = yard[(c["model"], c["mode"])]
        worse = max(c["output_relative"] / mat["output_relative"], c["max_relative"] / mat["max_relative"])
        assert worse >= 10, (c["name"], worse)  # the injected kernel is 10x less accurate
        assert c["status"] == "failed", c["name"]
        assert c["vs_materialized"]["max_relative"] < 1e-3
    assert all(c["status"] == "passed" for k in ("fused", "auto") for c in _judged(checks, k))


@pytest.mark.slow  # every model variant, float32 and float64 (10 s or more)
def test_the_float64_proof_sees_what_float32_cannot(monkeypatch):
    """A kernel computing a slightly different function (scores 1e-7 off: within float32's
    rounding) passes the float32 judgement and fails the float64 proof."""
    real = ra.bias._additive_bias
    monkeypatch.setattr(ra.bias, "_additive_bias", lambda prev, *args: real(prev * (1 + 1e-7), *args))
    proof = {(c["kernel"], c["mode"]): c for c in exactness.float64_proof("cpu", TOY, log=lambda m: None)}
    assert proof[("bias", "sum")]["status"] == "failed" and proof[("fused", "sum")]["status"] == "passed"
    assert 1e-10 < proof[("bias", "sum")]["max_relative"] < 1e-5
    monkeypatch.setattr(ra.bias, "_additive_bias", real)
    assert all(c["status"] == "passed" for c in exactness.float64_proof("cpu", TOY, log=lambda m: None))


def test_relu_flips_explain_a_gradient_jump_only_where_they_can():
    """The judgement's ReLU-flip rule: a ReLU model's worst gradient above its limit in an
    FFN tensor with more flips than materialized's is reported with that explanation; the
    same numbers without extra flips, outside the FFN or on the GELU model fail; the output
    is judged whatever the flips."""
    plain, gelu = exactness.VARIANTS[1], exactness.VARIANTS[2]
    yard = {"materialized": dict(output=4.7e-7, gradient=1.7e-6), "fairseq": dict(output=4.0e-7, gradient=1.5e-6)}

    def dist(grad, tensor, out=7.6e-7):
        return dict(output_relative=out, max_relative=grad, worst_tensor=tensor, problems=[])

    fc1 = "decoder.layers.4.fc1.weight"
    flipped = exactness.judge("bias", "sum", plain, dist(1.5e-4, fc1), yard, flips=1, materialized_flips=0)
    assert flipped["status"] == "reported" and "ReLU flips" in flipped["reason"]
    assert exactness.judge("bias", "sum", plain, dist(1.5e-4, fc1), yard, 0, 0)["status"] == "failed"
    assert exactness.judge("bias", "sum", plain, dist(1.5e-4, "decoder.layers.4.self_attn.q_proj.weight"), yard,
                           1, 0)["status"] == "failed"
    assert exactness.judge("bias", "sum", gelu, dist(1.5e-4, fc1), yard, None, None)["status"] == "failed"
    assert exactness.judge("bias", "sum", plain, dist(1.5e-4, fc1, out=1e-5), yard, 1, 0)["status"] == "failed"
    assert exactness.judge("bias", "sum", plain, dist(2e-6, fc1), yard, 0, 0)["status"] == "passed"


def test_relu_flips_count_only_where_this_kernel_flips_a_unit_of_that_layer_and_materialized_does_not():
    """The H100 of 2026-11-28: triton and materialized each flipped 3 units of the peaked model,
    and triton's worst gradient was an fc1 weight. The count cannot say whether triton's flips
    are in that layer; the units can: explained only where a unit of the worst tensor's layer
    flips in this kernel and not in materialized, and only for an fc1 tensor."""
    peaked = exactness.VARIANTS[0]
    yard = {"materialized": dict(output=1.2e-5, gradient=4.3e-4), "fairseq": dict(output=4.3e-6, gradient=2.5e-4)}
    d = dict(output_relative=1.2e-5, max_relative=2.1e-3, worst_tensor="encoder.layers.4.fc1.weight", problems=[])
    mat = {"encoder.layers.4.fc1": {10}, "decoder.layers.1.fc1": {3, 4}}
    own = {"encoder.layers.4.fc1": {10, 77}, "decoder.layers.1.fc1": {3}}
    n = exactness.own_flips_in_layer(own, mat, d["worst_tensor"])
    assert n == 1
    c = exactness.judge("triton", "sum", peaked, dict(d), yard, flips=3, materialized_flips=3, own_flips=n)
    assert c["status"] == "reported" and "1 hidden unit(s) of that layer" in c["reason"]
    assert c["own_relu_flips_in_worst_layer"] == 1
    same = {"encoder.layers.4.fc1": {10}, "decoder.layers.1.fc1": {3, 4, 5}}  # the extra flip is elsewhere
    assert exactness.own_flips_in_layer(same, mat, d["worst_tensor"]) == 0
    assert exactness.judge("triton", "sum", peaked, dict(d), yard, 4, 3, own_flips=0)["status"] == "failed"
    assert exactness.own_flips_in_layer(own, mat, "encoder.layers.4.fc2.weight") is None  # fc1 only
    assert exactness.own_flips_in_layer(own, mat, "encoder.layers.4.self_attn.q_proj.weight") is None
    # a record without units (before they were measured): the count decides, as before
    assert exactness.judge("triton", "sum", peaked, dict(d), yard, 3, 3)["status"] == "failed"
    assert exactness.judge("triton", "sum", peaked, dict(d), yard, 4, 3)["status"] == "reported"


def test_triton_is_judged_by_name_on_cuda_where_it_applies(monkeypatch):
    """auto no longer runs triton on CUDA, so the check measures it by name there (float32 and
    half precision), never on CPU (only Triton's interpreter runs it there) nor in float64."""
    from realformer_nmt.modules.residual_attention import triton_kernel

    assert exactness.measured_kernels("cpu") == exactness.KERNELS
    monkeypatch.setattr(triton_kernel, "unsupported", lambda *a, **k: None)
    assert exactness.measured_kernels("cuda") == exactness.KERNELS + ("triton",)
    assert exactness.measured_kernels("cpu") == exactness.KERNELS
    monkeypatch.setattr(triton_kernel, "unsupported", lambda *a, **k: "triton is not installed")
    assert exactness.measured_kernels("cuda") == exactness.KERNELS


def test_a_triton_that_fails_here_is_one_failed_check_not_a_stopped_section(monkeypatch):
    """Judged by name, a Triton compile or launch error on a new GPU must not stop the quick
    check: the kernel's float32 check fails, naming the error, the other kernels are judged,
    the half-precision table leaves it out, and the record is JSON and renders."""
    from realformer_tools.experiments.gpu_check import report

    monkeypatch.setattr(exactness, "measured_kernels", lambda device: ("bias", "triton"))
    original = exactness._measure

    def measure(base, kernel, *args, **kwargs):
        if kernel == "triton":
            raise RuntimeError("PassManager::run failed")
        return original(base, kernel, *args, **kwargs)

    monkeypatch.setattr(exactness, "_measure", measure)
    checks = exactness.model_agreement("cpu", TOY, log=lambda m: None, variants=exactness.VARIANTS[:1])
    names = {c["name"]: c for c in checks}
    failed = names["triton float32 vs float64 (peaked, sum)"]
    assert failed["status"] == "failed" and "PassManager::run failed" in failed["reason"]
    assert names["bias float32 vs float64 (peaked, sum)"]["status"] in ("passed", "reported")
    halves = exactness.precision_distances("cpu", TOY, log=lambda m: None, variants=exactness.VARIANTS[:1])
    assert all("triton" not in c["distances"] and "bias" in c["distances"] for c in halves)
    json.dumps(checks + halves)
    assert any("triton float32 vs float64 (peaked, sum): failed" in line
               for line in report.exactness_lines(checks + halves))


def test_relu_flip_units_are_the_units_whose_sign_differs():
    ref = {"a.fc1": torch.tensor([[1.0, -1.0], [0.5, -0.5]])}
    got = {"a.fc1": torch.tensor([[1.0, 1e-7], [-1e-7, -0.5]])}
    assert exactness.relu_flip_units(got, ref) == {"a.fc1": {1, 2}}
    assert exactness.relu_flips(got, ref) == 2


@pytest.mark.slow  # float64 passes of the toy model (10 s or more on a loaded machine)
def test_one_relu_flip_moves_an_fc1_gradient_and_not_the_output():
    """The mechanism behind the H100's plain-model numbers, in float64 on the CPU: one
    hidden unit put on the other side of zero moves the worst gradient (an fc1 tensor) far
    more than the output."""
    found = exactness.one_relu_flip("cpu", gpu_check.QUICK_DRY.exact)
    assert found["worst_tensor"].endswith("fc1.weight")
    assert found["max_relative"] > 1000 * found["output_relative"]


def test_exactness_compares_each_tensor_not_the_concatenation():
    ref = {"big.weight": torch.ones(1000) * 100.0, "small.q_proj.weight": torch.ones(4)}
    grads = {"big.weight": ref["big.weight"].clone(), "small.q_proj.weight": torch.ones(4) * 1.01}
    result = exactness.compare_gradients(grads, ref)
    # 1% off on one small tensor: invisible in the concatenated vector, a failure per tensor
    assert result["problems"] and "small.q_proj.weight" in result["problems"][0]


def test_precision_cost_is_judged_against_vanilla_measured_the_same_way(monkeypatch):
    """Each fp32 checkpoint evaluated in fp16 / bf16: a kernel within max(0.5%, 1.5x
    vanilla's shift) passes on CUDA, beyond it fails; vanilla is the yardstick; the dry run
    reports the same numbers."""
    from realformer_tools.experiments.gpu_check import precision

    nll = {("vanilla", "float32"): 2.0, ("vanilla", "float16"): 2.002, ("vanilla", "bfloat16"): 2.04,
           ("bias", "float32"): 2.0, ("bias", "float16"): 2.009, ("bias", "bfloat16"): 2.05,
           ("auto", "float32"): 2.0, ("auto", "float16"): 2.011, ("auto", "bfloat16"): 2.07}
    monkeypatch.setattr(precision, "valid_nll", lambda path, data, dtype, device: dict(
        nll=nll[(path, dtype)], tokens=100, sentences=10))
    checkpoints = {k: k for k in ("vanilla", "bias", "auto")}
    rows = {(c["dtype"], c["kernel"]): c for c in precision.checkpoint_shift_checks(
        checkpoints, "data", "cuda", judged=True, log=lambda m: None)}
    assert rows[("float16", "vanilla")]["status"] == "reported"
    assert rows[("float16", "bias")]["status"] == "passed"    # 0.45% <= 0.5% (the floor)
    assert rows[("float16", "auto")]["status"] == "failed"    # 0.55% > 0.5%
    assert rows[("bfloat16", "bias")]["status"] == "passed"   # 2.5% <= 1.5 x 2%
    assert rows[("bfloat16", "auto")]["status"] == "failed"   # 3.5% > 3%
    assert "1.5x vanilla's 2.000%" in rows[("bfloat16", "auto")]["reason"]
    dry = precision.checkpoint_shift_checks(checkpoints, "data", "cpu", judged=False, log=lambda m: None)
    assert {c["status"] for c in dry} == {"reported"}


def test_precision_gap_over_seeds_is_judged_against_vanillas_plus_two_standard_errors():
    from realformer_tools.experiments.gpu_check import precision

    def runs(kernel, fp32, bf16):
        return [dict(name=f"{p}/{kernel}", status="passed", precision=p, kernel=kernel, seed=seed, valid_nll=v)
                for seed, (a, b) in enumerate(zip(fp32, bf16), start=1) for p, v in (("fp32", a), ("bf16", b))]

    vanilla = runs("vanilla", [2.0, 2.1, 2.05], [2.02, 2.13, 2.06])
    close = runs("bias", [2.0, 2.1, 2.05], [2.03, 2.12, 2.08])
    far = runs("fused", [2.0, 2.1, 2.05], [2.2, 2.3, 2.25])
    rows = {c["kernel"]: c for c in precision.seed_gap_checks(vanilla + close + far, judged=True)}
    assert rows["bias"]["status"] == "passed" and rows["fused"]["status"] == "failed"
    assert rows["fused"]["seeds"] == [1, 2, 3] and rows["fused"]["se"] > 0
    one_seed = [c for c in vanilla + far if c["seed"] == 1]
    (row,) = precision.seed_gap_checks(one_seed, judged=True)
    assert row["status"] == "reported" and "at least 2" in row["reason"]


def _speed_config(length, rounds, vanilla, bias, memory=1.0):
    variants = {"vanilla": dict(train_step_seconds_all=[vanilla] * rounds, train_speed_ratio=1.0,
                                peak_memory_ratio=1.0),
                "bias": dict(train_step_seconds_all=bias(rounds), peak_memory_ratio=memory,
                             train_speed_ratio=None)}
    return {"configs": [dict(size="base", length=length, variants=variants)]}


def test_speed_targets_are_judged_on_the_median_of_at_least_seven_rounds():
    from realformer_tools.experiments.gpu_check.quick import speed_checks

    # one slow round among seven: the median meets 0.95x, the mean would not
    def one_slow(n):
        return [1.0] * (n - 1) + [2.0]

    met = speed_checks(_speed_config(128, 7, 1.0, one_slow), "cmd", dry_run=False)[1]
    assert met["status"] == "passed" and met["speed_ratio"] == 1.0 and met["speed_low"] == 0.5
    assert met["rounds"] == 7
    slow = speed_checks(_speed_config(128, 7, 1.0, lambda n: [1.2] * n), "cmd", dry_run=False)[1]
    assert slow["status"] == "failed" and "median 0.83x" in slow["reason"]
    few = speed_checks(_speed_config(128, 3, 1.0, lambda n: [1.2] * n), "cmd", dry_run=False)[1]
    assert few["status"] == "reported" and "fewer than 7 rounds" in few["reason"]
    memory = speed_checks(_speed_config(512, 9, 1.0, lambda n: [1.0] * n, memory=1.2), "cmd", dry_run=False)[1]
    assert memory["status"] == "failed"


def test_triton_is_judged_on_its_own_stricter_targets():
    """``triton`` beside ``bias``: its row judges >= 0.95x speed and <= 1.00x memory at T = 512
    (bias's there: 0.90x / 1.15x), so 0.92x and 1.05x pass bias's target and fail triton's."""
    from realformer_tools.experiments.gpu_check.quick import speed_checks

    result = _speed_config(512, 7, 1.0, lambda n: [1 / 0.92] * n, memory=1.05)
    variants = result["configs"][0]["variants"]
    variants["triton"] = dict(variants["bias"])
    checks = {c["variant"]: c for c in speed_checks(result, "cmd", dry_run=False)[1:]}
    assert checks["bias"]["status"] == "passed" and checks["bias"]["min_speed"] == 0.90
    assert checks["triton"]["status"] == "failed"
    assert (checks["triton"]["min_speed"], checks["triton"]["max_memory"]) == gpu_check.TRITON_SPEED_TARGETS[512]


def test_gpu_tests_have_a_time_limit_each():
    """tests/conftest.py: a ``gpu`` test past its limit fails with one line (issue 51: one
    ran for minutes and the suite never ended)."""
    import time

    import conftest

    class Marker:
        def __init__(self, *args):
            self.args = args

    item = types.SimpleNamespace(nodeid="t::slow", get_closest_marker=lambda name: {
        "gpu": Marker(), "gpu_seconds": Marker(1)}.get(name))
    hook = conftest.pytest_runtest_call(item)
    next(hook)
    with pytest.raises(conftest.GpuTestTimeout, match="ran past its 1s limit"):
        time.sleep(5)
    with pytest.raises(StopIteration):
        next(hook)
    plain = types.SimpleNamespace(nodeid="t::cpu", get_closest_marker=lambda name: None)
    hook = conftest.pytest_runtest_call(plain)
    next(hook)
    time.sleep(1.2)  # no limit on a test that is not marked gpu
    with pytest.raises(StopIteration):
        next(hook)


class FakeRank:
    """A rank process: exits at ``ends`` (a time on the fake clock; None: never), killed or
    aborted by the check."""

    def __init__(self, clock, ends, on_start=None):
        self.clock, self.ends, self.signals = clock, ends, []
        self.returncode = None
        if on_start:
            on_start()

    def poll(self):
        if self.returncode is None and self.ends is not None and self.clock[0] >= self.ends:
            self.returncode = 0
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)
        self.returncode = -sig

    def kill(self):
        self.returncode = -9

    def wait(self, timeout=None):
        return self.poll() if self.returncode is None else self.returncode


def _ranks(tmp_path, monkeypatch, ends, done_at):
    """run_ranks with fake processes on a fake clock; rank 0's log says "done training" at
    ``done_at``."""
    from realformer_tools.experiments.gpu_check import ddp_step

    clock = [0.0]
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    procs = []

    def popen(cmd, **kw):
        procs.append(FakeRank(clock, ends[len(procs)]))
        return procs[-1]

    def sleep(seconds):
        clock[0] += seconds
        if done_at is not None and clock[0] >= done_at:
            logs[0].write_text("... | INFO | fairseq_cli.train | done training in 9.0 seconds\n")

    monkeypatch.setattr(ddp_step.time, "sleep", sleep)
    result = ddp_step.run_ranks([["a"], ["b"]], [str(p) for p in logs], {}, train_limit=60, exit_seconds=20,
                                poll=1.0, clock=lambda: clock[0], popen=popen)
    return result, procs


def test_two_ranks_that_exit_after_training_are_timed(tmp_path, monkeypatch):
    result, procs = _ranks(tmp_path, monkeypatch, ends=[33, 34], done_at=30)
    assert result["stopped"] is None and result["returncodes"] == [0, 0]
    assert result["done_at"] == 30 and result["exit_seconds"] == 4


def test_a_slow_exit_after_training_is_stopped_and_reported_as_such(tmp_path, monkeypatch):
    """The H100 run: rank 0 logged "done training" and the ranks did not exit; the check
    waits the exit allowance, then SIGABRT (every thread's stack into the log) and reports
    a slow exit, not a hang in training."""
    import signal

    result, procs = _ranks(tmp_path, monkeypatch, ends=[None, None], done_at=30)
    assert result["stopped"] == "slow exit" and result["done_at"] == 30
    assert all(p.signals == [signal.SIGABRT] for p in procs)
    assert result["seconds"] <= 30 + 20 + 2


def test_ranks_that_never_finish_training_stop_at_their_limit(tmp_path, monkeypatch):
    result, procs = _ranks(tmp_path, monkeypatch, ends=[None, None], done_at=None)
    assert result["stopped"] == "training limit" and result["done_at"] is None
    assert 60 <= result["seconds"] <= 62


def test_ddp_time_is_reserved_from_the_measured_step_time():
    from realformer_tools.experiments.gpu_check import ddp_step

    limit = ddp_step.ddp_time_limit(0.25, 30)
    assert limit == gpu_check.settings.DDP_STARTUP_SECONDS + gpu_check.settings.DDP_STEP_FACTOR * 0.25 * 30
    assert ddp_step.ddp_time_limit(2.0, 100, reserve=80) == 80 - gpu_check.settings.DDP_EXIT_SECONDS - 5
    assert ddp_step.ddp_time_limit(None, 30) > gpu_check.settings.DDP_STARTUP_SECONDS


def test_rejudging_the_committed_h100_run():
    """results/gpu/h100-2026-11-27: the first run's quick.json judged again by today's
    yardsticks, from the committed files only (no GPU)."""
    import shutil
    import tempfile

    from realformer_tools.experiments.gpu_check.rejudge import rejudge

    folder = REPO / "results" / "gpu" / "h100-2026-11-27"
    with tempfile.TemporaryDirectory() as out:
        record, path = rejudge(str(folder / "quick.json"), out)
        assert json.loads(open(path).read())["status"] == record["status"]
        committed = json.loads((folder / "rejudged.json").read_text())
        shutil.rmtree(out)
    assert record["rejudged"]["original_status"] == "failed" and record["status"] == "passed"
    assert {k: v["status"] for k, v in record["sections"].items()} == \
        {k: v["status"] for k, v in committed["sections"].items()}
    exact = {c["name"]: c for c in record["sections"]["exactness"]["checks"]}
    for kernel in ("bias", "fused", "auto"):
        for mode in MODES:
            assert exact[f"{kernel} float32 vs float64 (peaked, {mode})"]["status"] == "passed"
    plain = exact["bias float32 vs float64 (plain, sum)"]
    assert plain["status"] == "reported" and "ReLU" in plain["reason"] and plain["max_relative"] == 1.5e-4
    assert exact["bias vs materialized (sum)"]["status"] == "reported"  # the old yardstick, kept
    speed = record["sections"]["speed"]["checks"]
    assert [c["status"] for c in speed if c.get("min_speed")] == ["reported", "reported"]  # 3 rounds < 7
    (rule,) = [c for c in speed if c.get("rule")]
    assert rule["rule"] == {"first_layer": "bias", "later_layers": "bias"}
    ddp = {c["name"]: c for c in record["sections"]["ddp"]["checks"]}
    assert ddp["pytorch_ddp x2: exit after training"]["exit_seconds_at_most"] == pytest.approx(16.2, abs=0.1)
    assert gpu_check.main(["--rejudge", str(folder / "missing.json")]) == 2


def test_rejudging_a_table_with_triton_takes_no_noise_floor_from_auto(tmp_path):
    """In the H100 run of 2026-11-28 auto ran triton, not bias: the rule derived again from its
    speed table must not treat auto as a second timing of bias (that gave a false 8% noise
    floor and picked bias); without a floor the 2% tie margin applies."""
    import shutil

    from realformer_tools.experiments.gpu_check.rejudge import rejudge

    folder = tmp_path / "h100-2026-11-28"
    shutil.copytree(REPO / "results" / "gpu" / "h100-2026-11-28", folder)
    record, _ = rejudge(str(folder / "quick.json"), str(tmp_path / "out"))
    (rule,) = [c for c in record["sections"]["speed"]["checks"] if c.get("rule")]
    assert rule["measured"]["noise"] is None and rule["measured"]["tie_margin"] == 0.02
    assert rule["rule"] == {"first_layer": "materialized", "later_layers": "materialized"}
    # every rank saved in this run and the check compared their parameters: its judgement stands
    committed = json.loads((folder / "quick.json").read_text())["sections"]["ddp"]["checks"]
    assert record["sections"]["ddp"]["checks"] == committed
    assert record["sections"]["ddp"]["checks"][0]["status"] == "passed"


def test_gpu_md_states_the_targets_the_check_applies_and_runnable_commands():
    """docs/gpu.md is for any CUDA user: the targets are in the page (the numbers the code
    judges by), every `make gpu-check` line in it parses, and no one machine's conventions."""
    import re
    import shlex

    text = (REPO / "docs" / "gpu.md").read_text()
    for targets in (gpu_check.SPEED_TARGETS, gpu_check.TRITON_SPEED_TARGETS):
        for length, (speed, memory) in targets.items():
            assert f"**>= {speed:.2f}x**" in text and f"**<= {memory:.2f}x**" in text and f"T = {length}" in text
    assert f"relative error of {exactness.RELATIVE_TOLERANCE:.0e}".replace("e-04", "e-4") in text
    # the yardsticks the code judges by (issue 51), each stated with its number
    assert f"**{exactness.YARDSTICK_FACTOR:g}x the larger** yardstick **+ {exactness.YARDSTICK_SLACK:g}**" in text
    assert f"**{exactness.FLOAT64_TOLERANCE:g}**" in text
    settings = gpu_check.settings
    assert (f"**max({settings.PRECISION_SHIFT_FLOOR:.1%}, {settings.PRECISION_SHIFT_FACTOR:g}x vanilla's "
            "shift)**") in text
    assert f"**{settings.PRECISION_GAP_SE:g} standard errors**" in text
    assert f"at least **{gpu_check.SPEED_MIN_ALTERNATIONS}**" in text
    assert "$OUT" not in text and "lent" not in text
    lines = [line for line in text.splitlines() if line.startswith("make gpu-check")]
    assert any("--quick" in line for line in lines) and len(lines) >= 4
    for line in lines:
        words = shlex.split(line.split("#")[0])
        args = next((w.split("=", 1)[1] for w in words if w.startswith("GPU_CHECK_ARGS=")), "")
        parsed = gpu_check.parse_args(args.split())
        assert parsed.quick == ("--quick" in args)
    assert re.search(r"bash scripts/gpu_machine_setup.sh && make gpu-check PY=python3 GPU_CHECK_ARGS=--quick", text)
