"""Every kernel in half precision against float32, on CUDA (marker ``gpu``) and on CPU.

The same test bodies run per device: ``cuda`` cases carry the ``gpu`` marker (``pytest
-m gpu``, run by ``make gpu-check``'s ``tests`` step) and are skipped without CUDA;
``cpu`` cases run in the normal suite in bf16 (CPU has no fast fp16), so the logic is
exercised everywhere.

Precisions: ``fp16`` / ``bf16`` (the model cast, as ``fairseq-train --fp16/--bf16`` and
``--memory-efficient-*`` run it) and ``amp`` (float32 weights under ``torch.autocast``,
as ``--amp`` runs it; fp16 on CUDA, bf16 on CPU).

Reference: the same weights in float32 with the ``materialized`` kernel (itself checked
against the paper's formula in test_paper_formula.py). Tolerances are relative errors
over the whole tensor, ``||x - ref|| / ||ref||`` (logits; all parameter gradients
together). Measured on CPU (6 and 24 layers, every kernel): bf16 logits 0.010-0.012,
gradients 0.018-0.044; amp (bf16) logits 0.008-0.009, gradients 0.015-0.043. The bf16
bounds are about 3x that; fp16 has 3 more mantissa bits (8x finer), and its bounds are
set at a quarter of bf16's, leaving room for what fp16 rounds differently on CUDA
(measured there by ``make gpu-check``):

| compute dtype          | logits | gradients |
| ---------------------- | ------ | --------- |
| bf16 (bf16, amp on CPU) | 0.035  | 0.13      |
| fp16 (fp16, amp on CUDA) | 0.01   | 0.035     |
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import attend, batch, build

from realformer_nmt.modules import ResidualMultiheadAttention
from realformer_nmt.modules.residual_attention import KERNELS

CUDA = torch.cuda.is_available()
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]),
]
# precision -> (parameter dtype, autocast dtype or None)
PRECISIONS = {
    "fp16": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
    "amp": (torch.float32, torch.float16),
}
CPU_PRECISIONS = {"bf16": (torch.bfloat16, None), "amp": (torch.float32, torch.bfloat16)}
TOLERANCE = {torch.bfloat16: (0.035, 0.13), torch.float16: (0.01, 0.035)}  # (logits, gradients)

SIZE = dict(encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=128, decoder_ffn_embed_dim=128,
            encoder_attention_heads=4, decoder_attention_heads=4)


@pytest.fixture(autouse=True)
def one_cpu_thread():
    """These models are small: one intra-op thread is several times faster on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def skip_triton_on_cpu(kernel, device):
    """On CPU the triton kernel runs only in Triton's interpreter, far too slow for these
    models: tests/test_triton_kernel.py checks it there; here it runs on CUDA."""
    if kernel == "triton" and device == "cpu":
        pytest.skip("triton on CPU: Triton's interpreter (tests/test_triton_kernel.py)")


def cases():
    out = []
    for device in DEVICES:
        name = device.values[0]
        for precision in (CPU_PRECISIONS if name == "cpu" else PRECISIONS):
            out.append(pytest.param(name, precision, id=f"{name}-{precision}", marks=device.marks))
    return out


def setting(device, precision):
    table = CPU_PRECISIONS if device == "cpu" else PRECISIONS
    param_dtype, autocast = table[precision]
    return param_dtype, autocast, autocast or param_dtype  # the dtype the matmuls run in


def relative_error(x, ref):
    x, ref = x.detach().float(), ref.detach().float()
    return float((x - ref).norm() / ref.norm())


def forward_backward(model, src, lengths, tgt, target, autocast, device):
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=autocast, enabled=autocast is not None):
        logits, _ = model(src, lengths, tgt)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
    loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return logits.float(), grads


def twin_models(dictionary, device, param_dtype, kernel, layers, **overrides):
    """(model under test in ``param_dtype`` with ``kernel``, float32 materialized reference),
    same weights; dropout off."""
    dims = dict(SIZE, encoder_layers=layers, decoder_layers=layers, **overrides)
    ref = build(dictionary=dictionary, residual_attention_kernel="materialized", **dims).to(device).train()
    model = build(dictionary=dictionary, residual_attention_kernel=kernel, **dims)
    model.load_state_dict(ref.state_dict())
    return model.to(device=device, dtype=param_dtype).train(), ref


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layers", [6, 24])
@pytest.mark.parametrize("device,precision", cases())
def test_low_precision_forward_and_backward_match_float32_reference(dictionary, device, precision, layers, kernel):
    skip_triton_on_cpu(kernel, device)
    param_dtype, autocast, compute = setting(device, precision)
    model, ref = twin_models(dictionary, device, param_dtype, kernel, layers)
    src, lengths, tgt = (t.to(device) for t in batch(dictionary, bsz=4, src_len=12, tgt_len=10))
    target = torch.roll(tgt, -1, dims=1)
    want_logits, want_grads = forward_backward(ref, src, lengths, tgt, target, None, device)
    logits, grads = forward_backward(model, src, lengths, tgt, target, autocast, device)
    tol_logits, tol_grads = TOLERANCE[compute]
    assert torch.isfinite(logits).all() and torch.isfinite(grads).all()
    assert relative_error(logits, want_logits) < tol_logits
    assert relative_error(grads, want_grads) < tol_grads


def step_by_step(model, enc, tgt):
    state, outs = {}, []
    for t in range(tgt.size(1)):
        logits, _ = model.decoder(tgt[:, : t + 1], enc, incremental_state=state)
        outs.append(logits)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("device,precision", cases())
def test_cached_decoding_equals_full_pass_in_low_precision(dictionary, device, precision, kernel):
    """Both in the same precision: only rounding separates the cached rows from the full
    pass (the full pass may run another kernel), so the logits agree to the dtype's
    resolution; the argmax (what greedy search picks) agrees almost everywhere."""
    skip_triton_on_cpu(kernel, device)
    param_dtype, autocast, compute = setting(device, precision)
    model, _ = twin_models(dictionary, device, param_dtype, kernel, 6)
    model.eval()
    src, lengths, tgt = (t.to(device) for t in batch(dictionary, bsz=4, src_len=12, tgt_len=10))
    with torch.no_grad(), torch.autocast(device_type=device, dtype=autocast, enabled=autocast is not None):
        full, _ = model(src, lengths, tgt)
        cached = step_by_step(model, model.encoder(src, lengths), tgt)
    assert cached.shape == full.shape
    assert relative_error(cached, full) < TOLERANCE[compute][0]
    assert (cached.argmax(-1) == full.argmax(-1)).float().mean() > 0.95


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("device,precision", cases())
def test_48_layer_model_stays_finite_forward_and_backward(dictionary, device, precision, mode, kernel):
    skip_triton_on_cpu(kernel, device)
    param_dtype, autocast, _ = setting(device, precision)
    deep = dict(encoder_layers=48, decoder_layers=48, encoder_embed_dim=16, decoder_embed_dim=16,
                encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16,
                encoder_attention_heads=2, decoder_attention_heads=2)
    model = build(dictionary=dictionary, residual_attention_kernel=kernel, residual_attention_mode=mode,
                  **deep).to(device=device, dtype=param_dtype).train()
    sums = []
    for m in model.modules():
        if isinstance(m, ResidualMultiheadAttention) and m.residual:
            m.register_forward_hook(lambda mod, args, kwargs, out: sums.append(kwargs["residual_path"].state),
                                    with_kwargs=True)
    src, lengths, tgt = (t.to(device) for t in batch(dictionary))
    logits, grads = forward_backward(model, src, lengths, tgt, torch.roll(tgt, -1, dims=1), autocast, device)
    assert torch.isfinite(logits).all() and torch.isfinite(grads).all()
    assert grads.abs().sum() > 0
    assert len(sums) == 48 * 3  # every residual attention ran
    for state in (s for s in sums if s is not None):  # a path's last layer may hand on nothing
        running = state.running_sum()
        assert running.dtype == torch.float32 and torch.isfinite(running).all()


# --------------------------------------------------------------------------------------
# the bias kernel keeps the mask's gradient on the backend it is restricted to (issue 23)
# --------------------------------------------------------------------------------------


# aten op -> SDPA backend (torch.nn.attention.SDPBackend names)
BACKEND_OPS = (("_efficient_attention", "EFFICIENT_ATTENTION"), ("_cudnn_attention", "CUDNN_ATTENTION"),
               ("_flash_attention", "FLASH_ATTENTION"), ("_scaled_dot_product_attention_math", "MATH"))


def sdpa_backends(profile_result):
    """The SDPA backends whose aten ops a ``torch.profiler`` run recorded."""
    return sorted({backend for event in profile_result.events() for fragment, backend in BACKEND_OPS
                   if fragment in event.name and not str(getattr(event, "device_type", "")).endswith("CUDA")})


@pytest.mark.parametrize("device", DEVICES)
def test_bias_layer_mask_gradient_equals_materialized_float32(device):
    """On CUDA the bias layer's SDPA call runs on the memory-efficient backend only (cuDNN
    attention returns no mask gradient), forward and backward, as the profiler records; its
    output, the running sum's gradient and the projections' gradients equal materialized's
    (relative error <= 1e-4). On the CPU, SDPA's math kernel runs forward."""
    from torch.profiler import ProfilerActivity, profile

    from realformer_nmt.modules.residual_attention import ResidualState

    torch.backends.cuda.matmul.allow_tf32 = False
    embed, heads, bsz, length = 64, 4, 4, 24
    g = torch.Generator().manual_seed(3)
    x = torch.randn(length, bsz, embed, generator=g).to(device)
    prev = (3.0 * torch.randn(bsz, heads, length, length, generator=g)).to(device)
    pad = torch.zeros(bsz, length, dtype=torch.bool, device=device)
    pad[0, -2:] = True
    results, backends = {}, {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for kernel in ("materialized", "bias"):
        torch.manual_seed(3)
        module = ResidualMultiheadAttention(embed, heads, self_attention=True, residual=True, mode="mean",
                                            kernel=kernel).to(device)
        scores = prev.clone().requires_grad_(True)
        with profile(activities=activities) as forward:
            out = attend(module, x, x, x, key_padding_mask=pad, prev_state=ResidualState.of_scores(scores, terms=1),
                         need_weights=False)[0]
        weights = torch.linspace(0.5, 1.5, out.numel(), device=out.device).view_as(out)
        with profile(activities=activities) as backward:
            (out * weights).sum().backward()
        backends[kernel] = (sdpa_backends(forward), sdpa_backends(backward))
        results[kernel] = [out.detach(), scores.grad] + [module.get_parameter(f"{p}_proj.weight").grad for p in "qkv"]
    for got, want in zip(results["bias"], results["materialized"]):
        assert relative_error(got, want) <= 1e-4
    assert float(results["materialized"][1].norm()) > 0  # the running sum's gradient is there to compare
    want = "EFFICIENT_ATTENTION" if device == "cuda" else "MATH"
    assert backends["bias"][0] == [want]
    if device == "cuda":
        assert backends["bias"][1] == [want]


def test_gpu_tests_have_a_time_limit_each():
    """tests/conftest.py: a ``gpu`` test past its limit fails with one line (one ran for
    minutes on the first GPU and the suite never ended)."""
    import time
    import types

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
