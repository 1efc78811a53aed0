"""The ``triton`` kernel (realformer_nmt/modules/residual_attention/triton.py) against a float64
reference written out below: output, new running sum and the gradients of q, k, v and the
previous sum, for every mask layout of a translation model (encoder self attention with
left-padded keys, decoder self attention causal with right- or left-padded keys, cross
attention), sum and mean, the first, a middle and the last layer of a path, lengths that are
not multiples of the block size, head dims 32, 64 and 128; float32 and float16 / bfloat16
inputs within the error of fairseq's own attention recipe in that precision; attention dropout
against the same reference applying the kernel's own keep mask; the sums a path keeps and their
bit-identical rebuild; launches per layer and compiled variants per run; a whole
``realformer_transformer`` with ``triton`` equals ``materialized`` in training and in cached
beam search; where it does not apply, it falls back and says so once.

Without CUDA the kernels run in Triton's interpreter (tests/conftest.py switches it on
before triton is imported), with CUDA on the GPU. Without triton these tests are skipped,
except the ones that check the plugin works without it.
"""

import contextlib
import importlib
import logging
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, attend, batch, build, cli_env, make_dictionary

from realformer_nmt.modules import ResidualMultiheadAttention
from realformer_nmt.modules import residual_attention as ra
from realformer_nmt.modules.residual_attention import triton_kernel

FMIN = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def kernels():
    """The kernel module and the device it runs on here."""
    pytest.importorskip("triton", reason="triton is not installed (pip install '.[triton]')")
    if triton_kernel.interpreted():
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        pytest.skip("triton is compiled in this process and there is no CUDA device: run with TRITON_INTERPRET=1 "
                    "set before triton is imported (tests/conftest.py does so where CUDA is absent)")
    return importlib.import_module("realformer_nmt.modules.residual_attention.triton"), device


# --------------------------------------------------------------------------------------
# One layer against float64
# --------------------------------------------------------------------------------------

def reference(q, k, v, prev, pad, causal, divisor, scale, keep=None, p=0.0):
    """The layer as the paper and the materialized kernel define it: ``A = q k^T scale + prev``
    (passed on raw), ``dropout(softmax(mask(A / divisor))) v``; padded keys get float32's most
    negative finite logit (a row of padding only is uniform), the future ``-inf``; dropout
    multiplies the probabilities by ``keep / (1 - p)`` (``keep``: the kernel's own mask)."""
    a = torch.einsum("bhtd,bhsd->bhts", q, k) * scale
    if prev is not None:
        a = a + prev
    logits = a / divisor
    if causal:
        future = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], FMIN)
    probs = torch.softmax(logits, -1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return torch.einsum("bhts,bhsd->bhtd", probs, v), a


def fairseq_recipe(q, k, v, prev, pad, causal, divisor, scale):
    """fairseq's own (unfused) attention in the inputs' precision: ``q`` scaled and ``q k^T``
    in that dtype, softmax in float32, probabilities cast back, ``P v`` in that dtype; the
    residual sum in float32, as the materialized kernel keeps it."""
    a = torch.matmul(q * scale, k.transpose(-1, -2)).float()
    if prev is not None:
        a = a + prev
    logits = a / divisor
    if causal:
        logits = logits.masked_fill(torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).triu(1),
                                    float("-inf"))
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], FMIN)
    return torch.matmul(torch.softmax(logits, -1).to(v.dtype), v), a


# name: (causal, padding side, (T, S) in the interpreter, (T, S) on a GPU); blocks are 16 / 64
LAYOUTS = {
    "encoder": (False, "left", (18, 18), (130, 130)),
    "decoder": (True, "right", (18, 18), (130, 130)),
    "decoder, left-padded": (True, "left", (18, 18), (130, 130)),  # rows that see only padding
    "cross": (False, "left", (17, 21), (70, 150)),
}
POSITIONS = {"first": (False, False, 1), "middle": (True, True, 3), "last": (True, False, 4)}  # prev, G_next, n


def inputs(layout, position, head_dim, device, seed=0, bsz=2, heads=2):
    causal, side, cpu_shape, gpu_shape = LAYOUTS[layout]
    tgt_len, src_len = cpu_shape if device == "cpu" else gpu_shape
    has_prev, has_gnext, _ = POSITIONS[position]
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    # q, k, v as the module lays them out: [T, B, H, d] storage seen as [B, H, T, d]
    q = randn(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3) * 2
    k = randn(src_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    v = randn(src_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    prev = randn(bsz, heads, tgt_len, src_len) * 3 if has_prev else None
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    if side == "left":
        pad[0, :5] = True
        pad[1, :1] = True
    else:
        pad[0, -5:] = True
        pad[1, -1:] = True
    dout = randn(bsz, heads, tgt_len, head_dim)
    gnext = randn(bsz, heads, tgt_len, src_len) if has_gnext else None
    if causal and gnext is not None:  # a causal next layer sends no gradient above the diagonal
        gnext = gnext.tril()
    tensors = (q, k, v, prev, pad, dout, gnext)
    return tuple(None if t is None else t.to(device) for t in tensors), causal, side


def run_layer(fn, q, k, v, prev, dout, gnext, dtype):
    """``(out, A, dq, dk, dv, dprev)`` of ``fn`` on inputs cast to ``dtype`` (the previous sum
    stays float32, float64 for float64), for the loss ``<out, dout> + <A, G_{n+1}>``."""
    sum_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    leaves.append(None if prev is None else prev.detach().to(sum_dtype).requires_grad_(True))
    out, a = fn(*leaves)
    loss = (out.double() * dout).sum()
    if gnext is not None:
        loss = loss + (a.double() * gnext).sum()
    loss.backward()
    return [out, a] + [t.grad for t in leaves if t is not None]


def errors(got, want):
    """max |got - want| / max |want|, per tensor."""
    return [((g.double() - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want)]


def norm_errors(got, want):
    """|got - want| / |want| (Frobenius norms), per tensor: the typical error, where the
    largest one of a low-precision tensor is one rounding's luck."""
    return [((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want)]


def compare(kernels, layout, position, mode, head_dim, dtype, skip_future=True, p=0.0):
    """``(got, want, inputs)``; with dropout ``p`` the reference applies the kernel's own keep
    mask (``keep_mask`` of the seed and offset the call draws from torch's generator). The
    causal layouts' sums are compared on and below the diagonal (skipped blocks hold zeros)."""
    module, device = kernels
    (q, k, v, prev, pad, dout, gnext), causal, side = inputs(layout, position, head_dim, device)
    divisor = float(POSITIONS[position][2]) if mode == "mean" else 1.0
    scale = float(torch.tensor(head_dim ** -0.5, dtype=torch.float32))  # as the kernel receives it
    keep = None
    if p > 0:
        torch.manual_seed(123)
        keep = module.keep_mask((q.size(0), q.size(1), q.size(2), k.size(2)), p,
                                *module.philox_seed_offset(torch.device(device), 0), device=device).double()
    want = run_layer(lambda *t: reference(*t, pad, causal, divisor, scale, keep, p), q, k, v, prev, dout, gnext,
                     torch.float64)

    def kernel(q_, k_, v_, prev_):
        torch.manual_seed(123)  # the same seed and offset as keep_mask's above
        return module.residual_attention(q_, k_, v_, prev_, pad, causal=causal, dropout_p=p,
                                         skip_future=skip_future and side == "right", divisor=divisor,
                                         scale=scale)[:2]

    got = run_layer(kernel, q, k, v, prev, dout, gnext, dtype)
    assert got[0].dtype == dtype and got[1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert all(torch.isfinite(t).all() for t in got)
    if causal:
        got[1], want[1] = got[1].tril(), want[1].tril()
    return got, want, (q, k, v, prev, pad, dout, gnext, causal, divisor, scale)


NAMES = ["output", "new sum", "dq", "dk", "dv", "d previous sum"]
HEAD_DIMS = {"encoder": 32, "decoder": 64, "decoder, left-padded": 128, "cross": 32}


def exact_dtype(kernels):
    """The most exact precision the kernel runs in here, and its tolerance: float64 in the
    interpreter (rounding only, measured ~1e-15); float32 on CUDA, where Triton 3.6 cannot
    compile a float64 ``tl.dot`` (on an H100: "fp64 don't support largeK MMA", 2026-11-28) and
    the module never asks it to (``triton_kernel.unsupported``: float64 on CUDA)."""
    return (torch.float32, 1e-5) if kernels[1] == "cuda" else (torch.float64, 1e-12)


@pytest.mark.parametrize("position,mode", [("first", "sum"), ("middle", "sum"), ("middle", "mean"), ("last", "sum"),
                                           ("last", "mean")])  # a first layer's mean is its sum (c_1 = 1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_float64_equals_the_reference(kernels, layout, position, mode):
    """Every layout, position and mode, in float64: rounding only (measured: ~1e-15); on
    CUDA in float32 (``exact_dtype``)."""
    dtype, tolerance = exact_dtype(kernels)
    got, want, _ = compare(kernels, layout, position, mode, HEAD_DIMS[layout], dtype)
    for name, err in zip(NAMES, errors(got, want)):
        assert err < tolerance, f"{name}: {err:.1e}"


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_head_dims(kernels, head_dim):
    dtype, tolerance = exact_dtype(kernels)
    got, want, _ = compare(kernels, "cross", "middle", "mean", head_dim, dtype)
    assert max(errors(got, want)) < tolerance


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_equals_the_reference(kernels, layout):
    """float32 inputs, IEEE dot products (no TF32): float32 rounding (measured: <= 1e-6)."""
    for mode in ("sum", "mean"):
        got, want, _ = compare(kernels, layout, "middle", mode, HEAD_DIMS[layout], torch.float32)
        for name, err in zip(NAMES, errors(got, want)):
            assert err < 1e-5, f"{mode}, {name}: {err:.1e}"


def test_causal_kernel_skips_only_what_no_row_sees(kernels):
    """The causal kernel with and without skipping the blocks above the diagonal (right
    padding: every row sees a real key) computes the same, to float64 rounding (float32 on
    CUDA: ``exact_dtype``)."""
    dtype, tolerance = exact_dtype(kernels)
    skipped, want, _ = compare(kernels, "decoder", "middle", "sum", 32, dtype, skip_future=True)
    full, _, _ = compare(kernels, "decoder", "middle", "sum", 32, dtype, skip_future=False)
    assert max(errors(skipped, want)) < tolerance and max(errors(full, want)) < tolerance


# --------------------------------------------------------------------------------------
# Attention dropout
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_dropout_equals_the_reference_with_the_same_keep_mask(kernels, layout):
    """Every layout (padding left / right, causal, none), p = 0.1 in sum and 0.3 in mean mode:
    output, sum and every gradient equal the reference that applies the kernel's own keep mask."""
    dtype, tolerance = exact_dtype(kernels)
    for position, mode, p in (("middle", "sum", 0.1), ("last", "mean", 0.3)):
        got, want, _ = compare(kernels, layout, position, mode, HEAD_DIMS[layout], dtype, p=p)
        for name, err in zip(NAMES, errors(got, want)):
            assert err < tolerance, f"{position} {mode} {p}, {name}: {err:.1e}"


def test_dropout_rate_and_independence(kernels):
    """Over 64 tiles of 16 x 16 the dropped share is within its binomial 5-sigma interval, in
    every tile within its own; heads, rows and calls draw different masks; the sum handed on
    carries no dropout."""
    module, device = kernels
    for p in (0.1, 0.3):
        torch.manual_seed(0)
        shape = (2, 2, 64, 64)
        keep = module.keep_mask(shape, p, *module.philox_seed_offset(torch.device(device), 0), device=device)
        n = keep.numel()
        dropped = 1 - keep.double().mean().item()
        assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5, dropped
        tiles = 1 - keep.double().view(2, 2, 4, 16, 4, 16).mean(dim=(3, 5))
        assert ((tiles - p).abs() < 5 * (p * (1 - p) / 256) ** 0.5).all()
        assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0, :32], keep[0, 0, 32:])
        again = module.keep_mask(shape, p, *module.philox_seed_offset(torch.device(device), 0), device=device)
        assert not torch.equal(keep, again)
    (q, k, v, prev, pad, _, _), causal, _ = inputs("encoder", "middle", 32, device)
    q, k, v, prev = (t.float() for t in (q, k, v, prev))
    _, plain, _ = module.residual_attention(q, k, v, prev, pad)
    _, dropped, _ = module.residual_attention(q, k, v, prev, pad, dropout_p=0.3)
    assert torch.equal(plain, dropped)


def test_dropout_reproduces_with_torch_seed(kernels):
    """The seed and offset come from torch's generator: the same ``torch.manual_seed`` gives
    the same output bit for bit, another seed another one."""
    module, device = kernels
    (q, k, v, prev, pad, _, _), _, _ = inputs("cross", "middle", 32, device)
    q, k, v, prev = (t.float() for t in (q, k, v, prev))
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(module.residual_attention(q, k, v, prev, pad, dropout_p=0.1)[0])
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_dropout_on_cuda_takes_the_generators_philox_offset(kernels, monkeypatch):
    """On CUDA the seed is the device generator's and the offset its Philox offset, advanced past
    the call's draws (in steps of 4, as torch's own kernels advance it), so the next call's draws
    follow and ``torch.cuda.manual_seed`` (which ``--seed`` sets) replays them."""
    module = kernels[0]

    class Generator:
        offset = 8

        def initial_seed(self):
            return 7

        def get_offset(self):
            return self.offset

        def set_offset(self, offset):
            self.offset = offset

    monkeypatch.setattr(torch.cuda, "default_generators", (Generator(),))
    cuda = torch.device("cuda", 0)
    first, second = module.philox_seed_offset(cuda, 10), module.philox_seed_offset(cuda, 10)
    assert first == (7 + module.HIGH, 8 + module.HIGH) and second == (7 + module.HIGH, 20 + module.HIGH)
    assert torch.cuda.default_generators[0].offset == 32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_half_precision_within_fairseqs_own_error(kernels, layout, dtype):
    """Each tensor no further from float64 (relative, in norm) than twice the distance of
    fairseq's own attention recipe in the same precision on the same inputs (measured and
    printed here)."""
    got, want, (q, k, v, prev, pad, dout, gnext, causal, divisor, scale) = compare(
        kernels, layout, "middle", "mean", HEAD_DIMS[layout], dtype)
    recipe = run_layer(lambda *t: fairseq_recipe(*t, pad, causal, divisor, scale), q, k, v, prev, dout, gnext, dtype)
    ours, theirs = norm_errors(got, want), norm_errors(recipe, want)
    print(f"\n{layout} {dtype}: triton " + " ".join(f"{e:.1e}" for e in ours)
          + " | fairseq recipe " + " ".join(f"{e:.1e}" for e in theirs))
    for name, mine, yardstick in zip(NAMES, ours, theirs):
        assert mine <= 2 * yardstick + 1e-6, f"{name}: {mine:.1e} against fairseq's {yardstick:.1e}"


# --------------------------------------------------------------------------------------
# What a path stores, and what backward rebuilds
# --------------------------------------------------------------------------------------

def run_path(module, layout, dtype, layers=5, record=None, dropout_p=0.0, grads_at=None):
    """A path of ``layers`` layers (mean mode) on the inputs of ``layout``: outputs, sums and every
    gradient; ``record``: a list that receives each tensor autograd saves (its data pointer);
    ``grads_at``: one that receives where each sum's gradient lies (last layer first)."""
    device = torch.device(module.INTERPRETED and "cpu" or "cuda")
    causal, side = LAYOUTS[layout][:2]
    tensors = [inputs(layout, "middle", 32, device.type, seed=n)[0] for n in range(layers)]
    pad = tensors[0][4]
    leaves = [[t.to(dtype).requires_grad_(True) for t in layer[:3]] for layer in tensors]
    prev = chain = None
    outs, sums = [], []
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: record.append(t.data_ptr()) or t, lambda t: t)
    with hooks if record is not None else contextlib.nullcontext():
        for n, (q, k, v) in enumerate(leaves):
            torch.manual_seed(n)
            out, prev, chain = module.residual_attention(q, k, v, prev, pad, chain=chain, causal=causal,
                                                         skip_future=side == "right", divisor=n + 1.0,
                                                         scale=32 ** -0.5, dropout_p=dropout_p)
            outs.append(out)
            sums.append(prev)
            if grads_at is not None and n < layers - 1:
                prev.register_hook(lambda grad: grads_at.append(grad.data_ptr()))
    loss = sum((out.double() * layer[5]).sum() for out, layer in zip(outs, tensors))
    loss.backward()
    return outs, sums, [t.grad for layer in leaves for t in layer]


@pytest.mark.parametrize("layout,dtype", [("decoder", torch.float64), ("cross", torch.float32)],
                         ids=["decoder-float64", "cross-float32"])
def test_rebuilt_sums_are_bit_identical(kernels, monkeypatch, layout, dtype):
    """Backward rebuilds ``A_n`` from ``A_{n-2}`` by re-adding two layers' products in the
    forward's order and tiling: every gradient of a 4-layer path (with dropout) equals, bit for
    bit, the one rebuilt from ``A_{n-1}`` (one product, the forward's own last step)."""
    module, device = kernels
    if device == "cuda" and dtype == torch.float64:
        dtype = torch.float32  # Triton 3.6 cannot compile a float64 tl.dot for sm90 (exact_dtype)
    every_second = run_path(module, layout, dtype, layers=4, dropout_p=0.1)
    monkeypatch.setattr(module, "EVERY", 1)
    every = run_path(module, layout, dtype, layers=4, dropout_p=0.1)
    for got, want in zip(every_second[2], every[2]):
        assert torch.equal(got, want)


def test_a_path_keeps_only_every_second_sum(kernels):
    """Of a 6-layer path's float32 ``T x S`` sums, autograd keeps ``A_2`` and ``A_4`` (what
    backward rebuilds from), never a layer's own nor the last one."""
    module = kernels[0]
    saved = []
    _, sums, _ = run_path(module, "encoder", torch.float32, layers=6, record=saved)
    kept = [n + 1 for n, a in enumerate(sums) if a.data_ptr() in saved]
    assert kept == [2, 4]


def test_backward_writes_each_gradient_of_a_sum_over_the_next(kernels):
    """``G_n`` is written over ``G_{n+1}``: one ``T x S`` gradient buffer for the whole path."""
    grads_at = []
    run_path(kernels[0], "decoder", torch.float32, layers=4, grads_at=grads_at)
    assert len(grads_at) == 3 and len(set(grads_at)) == 1


def test_launches_per_layer(kernels, monkeypatch):
    """A layer's attention launches one kernel forward and three backward (``Delta``, keys,
    queries), and runs no other torch computation: the scaling, ``Delta`` and the sum's
    casts are inside the kernels (before, counted on the module: a scaling multiply forward;
    its gradient, a multiply, a sum and, in half precision, two casts backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    module, device = kernels
    launched, computed = [], []

    class Computed(TorchDispatchMode):
        paused = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if not (self.paused or func.is_view or name in ("empty", "empty_like")):
                computed.append(name)
            return func(*args, **(kwargs or {}))

    mode = Computed()

    class Counted:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(self.name)
                mode.paused = True  # the interpreter's own copies
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    mode.paused = False
            return launch

    for name in ("_forward", "_delta", "_backward_kv", "_backward_q"):
        monkeypatch.setattr(module, name, Counted(getattr(module, name), name))
    (q, k, v, prev, pad, dout, gnext), _, _ = inputs("cross", "middle", 32, device)
    q, k, v, prev = (t.to(torch.bfloat16 if t is not prev else torch.float32).requires_grad_(True)
                     for t in (q, k, v, prev))
    dout, gnext = dout.to(torch.bfloat16), gnext.float()
    module.residual_attention(q, k, v, prev, pad, scale=0.125)  # first call: allocates the no-padding flag
    with mode:
        out, a, _ = module.residual_attention(q, k, v, prev, pad, scale=0.125, dropout_p=0.1)
    assert launched == ["_forward", "_forward"] and computed == (["randint"] if device == "cpu" else [])  # seed
    launched.clear()
    computed.clear()
    with mode:
        torch.autograd.grad((out, a), (q, k, v, prev), (dout, gnext))
    assert launched == ["_delta", "_backward_kv", "_backward_q"] and computed == []


# --------------------------------------------------------------------------------------
# In the module and the model
# --------------------------------------------------------------------------------------

def test_module_stack_equals_materialized_on_every_row_and_kind(kernels):
    """A stack of four attention modules (as tests/test_kernels_agree.py runs the others):
    rows that see only padding, a fully padded sentence, padding alone."""
    import test_kernels_agree as agree

    if kernels[1] == "cuda":
        pytest.skip("the module helpers of test_kernels_agree run on CPU")
    for kind, mode in (("causal+left", "sum"), ("fully-padded-row", "mean")):
        x = torch.randn(agree.T, agree.B, agree.C, generator=torch.Generator().manual_seed(1))
        pad, attn_mask = agree.masks(kind)
        ref = agree.forward_backward("materialized", mode, pad, attn_mask, x)
        got = agree.forward_backward("triton", mode, pad, attn_mask, x)
        for i, what in enumerate(["outputs", "running sums", "input gradients"]):
            assert agree.relative_error(got[i], ref[i]) < 1e-5, (kind, what)
        worst = agree.relative_error(torch.cat([g.flatten() for g in got[3]]), torch.cat([g.flatten() for g in ref[3]]))
        assert worst < 1e-5, (kind, "parameter gradients")


MODEL = dict(encoder_attention_heads=2, decoder_attention_heads=2)


def twins(dictionary, device, mode="sum", **overrides):
    ref = build(dictionary=dictionary, residual_attention_kernel="materialized", residual_attention_mode=mode,
                **MODEL, **overrides)
    model = build(dictionary=dictionary, residual_attention_kernel="triton", residual_attention_mode=mode,
                  **MODEL, **overrides)
    model.load_state_dict(ref.state_dict())
    return model.to(device), ref.to(device)


def record_kernels(monkeypatch):
    ran = []
    original = ResidualMultiheadAttention._triton_forward

    def wrapper(self, *args, **kwargs):
        ran.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ResidualMultiheadAttention, "_triton_forward", wrapper)
    return ran


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_model_trains_as_materialized(kernels, monkeypatch, mode):
    """A 3+3-layer realformer_transformer in training mode, left-padded sources and
    right-padded targets: logits and every parameter's gradient equal materialized's; every
    path ran the kernel (the alignment layer's cross attention returns weights: materialized)."""
    device = kernels[1]
    d = make_dictionary()
    model, ref = twins(d, device, mode)
    src, lengths, tgt = (t.to(device) for t in batch(d, bsz=2))
    tgt[0, -2:] = d.pad()
    ran = record_kernels(monkeypatch)
    results = []
    for m in (model.train(), ref.train()):
        logits, _ = m(src, lengths, tgt)
        logits.float().pow(2).mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (got, got_grads), (want, want_grads) = results
    assert (got - want).abs().max() < 1e-5
    for name, grad in want_grads.items():
        assert (got_grads[name] - grad).abs().max() < 1e-5, name
    layers = model.encoder.layers
    assert set(ran) >= {layer.self_attn for layer in layers} | {layer.self_attn for layer in model.decoder.layers} \
        | {layer.encoder_attn for layer in model.decoder.layers[:-1]}


def test_a_training_run_compiles_one_variant_per_kernel(kernels, monkeypatch):
    """Training steps with attention dropout over batches of other lengths (multiples of 16 and
    not), padded and unpadded targets, every path and position: each kernel's launches share one
    specialization key as Triton forms it (argument types, divisibility by 16 of what is
    specialized, constexprs, options), so a run in one dtype compiles four kernels."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    module, device = kernels
    keys = {}

    class Keyed:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                names = self.kernel.arg_names
                key = tuple(native_specialize_impl(BaseBackend, arg, False, names[i] not in module.RUNTIME, True)
                            for i, arg in enumerate(args)) + tuple(sorted(kwargs.items()))
                keys.setdefault(self.name, set()).add(key)
                return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("_forward", "_delta", "_backward_kv", "_backward_q"):
        monkeypatch.setattr(module, name, Keyed(getattr(module, name), name))
    d = make_dictionary()
    model, _ = twins(d, device, "mean", attention_dropout=0.1)
    for src_len, tgt_len, pad_target in ((7, 6, True), (16, 32, False)):
        src, lengths, tgt = (t.to(device) for t in batch(d, bsz=2, src_len=src_len, tgt_len=tgt_len))
        if pad_target:
            tgt[0, -2:] = d.pad()
        model.train()(src, lengths, tgt)[0].float().pow(2).mean().backward()
    assert {name: len(variants) for name, variants in keys.items()} == {
        "_forward": 1, "_delta": 1, "_backward_kv": 1, "_backward_q": 1}


def test_cached_beam_search_equals_materialized(kernels):
    """fairseq's SequenceGenerator (the encoder runs the kernel; cached steps run
    materialized): the same hypotheses with the same scores."""
    from fairseq.sequence_generator import SequenceGenerator

    device = kernels[1]
    d = make_dictionary()
    model, ref = twins(d, device, "mean")
    src, lengths, _ = (t.to(device) for t in batch(d, bsz=2))
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        hypos = [SequenceGenerator([m.eval()], d, beam_size=3, max_len_b=6, min_len=2).forward(sample)
                 for m in (model, ref)]
    for got, want in zip(*hypos):
        assert [h["tokens"].tolist() for h in got] == [h["tokens"].tolist() for h in want]
        for g, w in zip(got, want):
            assert (g["positional_scores"] - w["positional_scores"]).abs().max() < 1e-5


# --------------------------------------------------------------------------------------
# Where it does not apply
# --------------------------------------------------------------------------------------

def stack_module(kernel="triton", **kw):
    torch.manual_seed(0)
    return ResidualMultiheadAttention(16, 4, self_attention=True, residual=True, kernel=kernel, **kw)


def test_falls_back_where_it_does_not_apply_and_says_so_once(kernels, monkeypatch, caplog):
    device = kernels[1]
    x = torch.randn(5, 2, 16, device=device)
    dropout = stack_module(dropout=0.1).to(device).train()
    with caplog.at_level(logging.WARNING, logger=triton_kernel.__name__):
        assert dropout.kernel_for(x, x, None, False, None) == "triton"  # attention dropout included
        assert dropout.kernel_for(x, x, {}, False, None) == "materialized"  # cached decoding
        assert dropout.kernel_for(x, x, None, True, None) == "materialized"  # weights requested
        other_mask = torch.zeros(5, 5)  # an additive mask other than the causal one
        ran = record_kernels(monkeypatch)
        module = stack_module().to(device)
        for _ in range(2):  # said once per model
            want, _, _ = attend(stack_module(kernel="materialized").to(device), x, x, x, attn_mask=other_mask,
                                need_weights=False)
            got, _, state = attend(module, x, x, x, attn_mask=other_mask, need_weights=False)
            assert ran and (got - want).abs().max() < 1e-5 and state.scores is not None
    said = [r.getMessage() for r in caplog.records]
    assert sum("other than fairseq's causal mask" in m and "'materialized'" in m for m in said) == 1


def test_reasons_it_does_not_apply(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(triton_kernel, "_installed", lambda: False)
    assert "not installed" in triton_kernel.unsupported(cpu)
    monkeypatch.setattr(triton_kernel, "_installed", lambda: True)
    monkeypatch.setattr(triton_kernel, "interpreted", lambda: False)
    assert "TRITON_INTERPRET=1" in triton_kernel.unsupported(cpu)
    assert "float64" in triton_kernel.unsupported(cuda, torch.float64)
    monkeypatch.setattr(triton_kernel, "interpreted", lambda: True)
    assert triton_kernel.unsupported(cpu, torch.float16, head_dim=64) is None
    assert "head dim" in triton_kernel.unsupported(cpu, torch.float16, head_dim=512)
    assert "int" in triton_kernel.unsupported(cpu, torch.int32)


def fake_cuda(monkeypatch, capability=(9, 0), installed=True):
    """A CUDA device of ``capability`` as ``triton_kernel.unsupported`` sees it, compiled Triton, no
    graph being captured."""
    monkeypatch.setattr(triton_kernel, "_installed", lambda: installed)
    monkeypatch.setattr(triton_kernel, "interpreted", lambda: False)
    monkeypatch.setattr(triton_kernel, "_capability", lambda index: capability)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: True)
    monkeypatch.setattr(ra.choice, "cuda_kernel_rule", lambda: dict(ra.DEFAULT_CUDA_RULE))


def test_auto_on_cuda_runs_triton_wherever_it_applies(monkeypatch, caplog):
    """With and without attention dropout, fp16 / bf16, every layer: triton; ``bias``
    where it does not apply (triton missing, an older GPU, float64), why said once."""
    cuda = torch.device("cuda")
    fake_cuda(monkeypatch)
    assert ra.choice.AUTO_PREFERS_TRITON is True
    for dropout in (False, True):
        for dtype in (torch.float16, torch.bfloat16):  # float32: bias (tests/test_triton_fallback.py)
            assert [ra.auto_kernel(device=cuda, training_dropout=dropout, terms=n, dtype=dtype, head_dim=64)
                    for n in (1, 2)] == ["triton", "triton"]
    assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, prefer_triton=False) == "bias"
    assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, dtype=torch.float64) == "bias"
    notes = ra.KernelNotes()  # one model's: what it says, once
    with caplog.at_level(logging.WARNING, logger=triton_kernel.__name__):
        fake_cuda(monkeypatch, installed=False)
        for _ in range(2):
            assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, notes=notes) == "bias"
        fake_cuda(monkeypatch, capability=(7, 5))
        assert ra.auto_kernel(device=cuda, training_dropout=False, terms=1, dtype=torch.float16, notes=notes) == "bias"
    said = [r.getMessage() for r in caplog.records]
    assert sum("not installed" in m and "'bias'" in m for m in said) == 1
    assert sum("compute capability 8.0" in m for m in said) == 1
    monkeypatch.setattr(ra.choice, "cuda_kernel_rule", lambda: {"first_layer": "triton", "later_layers": "triton"})
    assert ra.auto_kernel(device=cuda, training_dropout=False, terms=1) == "bias"  # a rule naming triton, no triton


def test_auto_stops_choosing_triton_when_triton_fails_here(kernels, monkeypatch, caplog):
    """auto chose triton and Triton itself failed (a compile or launch error on a machine it was
    not checked on): the call runs what auto runs without it, later calls too, said once; an
    explicit ``triton`` lets the error through, and so does auto for an error of ours before the
    launch (a previous sum of the wrong shape). Plain RuntimeErrors: tests/test_triton_fallback.py."""
    from realformer_nmt.modules.residual_attention import triton as triton_py

    device = kernels[1]
    failure = type("CompilationError", (Exception,), {"__module__": "triton.compiler.errors"})

    def broken(*args, **kwargs):
        raise failure("at 12:4: unsupported layout")

    monkeypatch.setattr(triton_py, "residual_attention", broken)
    monkeypatch.setattr(ra.choice, "auto_kernel",
                        lambda *a, prefer_triton=None, **k: "materialized" if prefer_triton is False else "triton")
    x = torch.randn(5, 2, 16, device=device)
    explicit = stack_module(kernel="triton").to(device)
    with pytest.raises(failure):
        attend(explicit, x, x, x, need_weights=False)
    assert explicit.notes.triton_failed is None
    want, _, _ = attend(stack_module(kernel="materialized").to(device), x, x, x, need_weights=False)
    auto = stack_module(kernel="auto").to(device)
    with caplog.at_level(logging.WARNING, logger=triton_kernel.__name__):
        got, _, state = attend(auto, x, x, x, need_weights=False)
        again, _, _ = attend(auto, x, x, x, need_weights=False)
    assert (got - want).abs().max() < 1e-5 and (again - want).abs().max() < 1e-5 and state.scores is not None
    assert "CompilationError" in auto.notes.triton_failed  # kept on the model's notes, not in the process
    said = [r.getMessage() for r in caplog.records]
    assert sum("disabled for auto" in m and "Triton failed on this machine" in m for m in said) == 1
    wrong = ra.ResidualState(scores=torch.zeros(2, 4, 5, 4, device=device), terms=1)
    with pytest.raises(ValueError, match="expected"):
        attend(stack_module(kernel="auto").to(device), x, x, x, need_weights=False, prev_state=wrong)


def test_the_plugin_works_without_importing_triton():
    """Importing the plugin, building a model and training a step with ``auto`` and with
    ``triton`` (which falls back on CPU outside the interpreter) import no triton."""
    code = (
        "import sys, torch, conftest\n"
        "from conftest import batch, build, make_dictionary\n"
        "d = make_dictionary()\n"
        "for kernel in ('auto', 'triton'):\n"
        "    model = build(dictionary=d, residual_attention_kernel=kernel).train()\n"
        "    src, lengths, tgt = batch(d)\n"
        "    model(src, lengths, tgt)[0].sum().backward()\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
        "print('ok')\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env["PYTHONPATH"]])
    env["TRITON_INTERPRET"] = "0"  # as a user's CPU install: conftest leaves triton alone
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
