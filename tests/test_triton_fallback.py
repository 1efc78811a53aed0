"""The ``triton`` kernel cannot break a run under ``auto``: any error while compiling or launching
it, forward or backward (a plain ``RuntimeError`` as the GPU gave: ``PassManager::run failed``, a
CUDA launch error), makes the model run its other kernels with one warning line, found by a probe
of the forward and backward kernels before the first real call; an explicit
``--residual-attention-kernel triton`` still raises. Any batch shape launches (``bsz * heads`` on
grid axis 0); float32 and CUDA graph capture run ``bias`` under ``auto``, said in one line.

Under Triton's interpreter (CPU), as tests/test_triton_kernel.py runs the kernels.
"""

import logging
import types

import pytest
import torch
from conftest import attend, batch, build, make_dictionary
from test_triton_kernel import fake_cuda, kernels, reference, stack_module  # noqa: F401  (kernels: a fixture)

from realformer_nmt.modules import residual_attention as ra
from realformer_nmt.modules.residual_attention import triton_kernel

OURS = "realformer_nmt"


@pytest.fixture
def fresh(kernels, monkeypatch):  # noqa: F811
    """The kernel module with nothing probed yet, and ``auto`` choosing ``triton`` here (``bias``
    without it, as on CUDA)."""
    module, device = kernels
    monkeypatch.setattr(module, "_PROBED", set())
    monkeypatch.setattr(ra.choice, "auto_kernel",
                        lambda *a, prefer_triton=None, **k: "bias" if prefer_triton is False else "triton")
    return module, device


class Broken:
    """A kernel whose compilation fails as Triton's did on an H100: a plain RuntimeError."""

    def __init__(self, launches):
        self.launches = launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append("broken")
            raise RuntimeError("PassManager::run failed\n(the MLIR dump follows)")
        return launch


def inject(module, where, monkeypatch, launches):
    """A plain RuntimeError in the forward kernel, in a backward kernel, or from every launch."""
    if where == "forward":
        monkeypatch.setattr(module, "_forward", Broken(launches))
    elif where == "backward":
        monkeypatch.setattr(module, "_backward_kv", Broken(launches))
    else:
        from triton.runtime import interpreter

        def refuse(self, *args, **kwargs):
            launches.append("launch")
            raise RuntimeError("Triton Error [CUDA]: invalid argument")

        monkeypatch.setattr(interpreter.GridExecutor, "__call__", refuse)


def train(model, device, steps=3):
    d = model.encoder.dictionary
    src, lengths, tgt = (t.to(device) for t in batch(d, bsz=2))
    tgt[0, -2:] = d.pad()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits, _ = model.train()(src, lengths, tgt)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    moved = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return losses, moved


@pytest.mark.parametrize("where", ["forward", "backward", "launch"])
def test_auto_trains_on_after_a_plain_runtime_error_with_one_line(fresh, monkeypatch, caplog, where):
    """Three training steps of a 2+2-layer model with attention dropout: the probe of the first
    call meets the error (the backward kernels included, which otherwise compile only at the
    first backward), the model runs ``bias`` from there on, every step trains, one warning line
    names the error, and Triton is not launched again."""
    module, device = fresh
    launches = []
    inject(module, where, monkeypatch, launches)
    model = build(dictionary=make_dictionary(), residual_attention_kernel="auto", encoder_attention_heads=2,
                  decoder_attention_heads=2, attention_dropout=0.1).to(device)
    with caplog.at_level(logging.INFO, logger=OURS):
        losses, moved = train(model, device)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    error = "PassManager::run failed" if where != "launch" else "Triton Error [CUDA]: invalid argument"
    assert said == [f"residual attention kernel 'triton' disabled for auto in this model (Triton failed on this "
                    f"machine: RuntimeError: {error}): auto runs its other kernels from here on"], said
    assert len(launches) == 1  # the probe's, then never again
    assert all(torch.isfinite(torch.tensor(losses))) and moved == len(list(model.parameters()))
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "runs" in r.getMessage()]
    assert any("runs bias" in m for m in infos), infos  # the model's summary line, said again for the fallback


def test_out_of_memory_is_the_batchs_and_leaves_triton_on(fresh, monkeypatch, caplog):
    """An out-of-memory error in the kernel is not Triton failing: it reaches the caller (fairseq
    skips that batch as for any kernel) and auto keeps running triton, with no warning."""
    module, device = fresh
    calls = []
    real = module.residual_attention

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "residual_attention", once)
    model = build(dictionary=make_dictionary(), residual_attention_kernel="auto", encoder_attention_heads=2,
                  decoder_attention_heads=2).to(device)
    src, lengths, tgt = (t.to(device) for t in batch(make_dictionary(), bsz=2))
    with caplog.at_level(logging.WARNING, logger=OURS):
        with pytest.raises(torch.OutOfMemoryError):
            model.train()(src, lengths, tgt)
        model(src, lengths, tgt)[0].float().sum().backward()  # the next batch: triton again
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert model.encoder.layers[0].self_attn.notes.triton_failed is None and len(calls) > 1


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_an_explicit_triton_still_raises(fresh, monkeypatch, where):
    """``--residual-attention-kernel triton``: no probe, no fallback; the error reaches the caller
    (in backward: at ``loss.backward()``, the step the probe saves an ``auto`` run from)."""
    module, device = fresh
    inject(module, where, monkeypatch, [])
    model = build(dictionary=make_dictionary(), residual_attention_kernel="triton", encoder_attention_heads=2,
                  decoder_attention_heads=2).to(device)
    src, lengths, tgt = (t.to(device) for t in batch(make_dictionary(), bsz=2))
    with pytest.raises(RuntimeError, match="PassManager::run failed"):
        model.train()(src, lengths, tgt)[0].float().sum().backward()
    assert module._PROBED == set() and model.encoder.layers[0].self_attn.notes.triton_failed is None


def test_the_probe_runs_once_per_device_dtype_head_dim_and_flags(fresh, monkeypatch):
    """A second forward with the same shapes and flags probes nothing; other flags (a previous sum,
    attention dropout) are probed once each, and a probe launches all four kernels."""
    module, device = fresh
    launched = []
    for name in ("_forward", "_delta", "_backward_kv", "_backward_q"):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, type("Counted", (), {"__getitem__": lambda self, grid, k=kernel, n=name: (
            launched.append(n) or k[grid])})())
    x = torch.randn(5, 2, 16, device=device)
    auto = stack_module(kernel="auto").to(device)
    for _ in range(2):
        _, _, state = attend(auto, x, x, x, need_weights=False)  # first layer of a path
    assert launched == ["_forward", "_delta", "_backward_kv", "_backward_q", "_forward", "_forward"]
    launched.clear()
    attend(auto, x, x, x, need_weights=False, prev_state=state)  # a previous sum: another set of flags
    attend(auto, x, x, x, need_weights=False, prev_state=state)
    assert launched == ["_forward", "_delta", "_backward_kv", "_backward_q", "_forward", "_forward"]
    assert len(module._PROBED) == 2


# --------------------------------------------------------------------------------------
# Any batch shape launches
# --------------------------------------------------------------------------------------

CUDA_GRID = (2**31 - 1, 65535, 65535)  # the most blocks a CUDA launch takes along x, y, z


def test_more_than_65535_sentence_heads_launch_and_compute(kernels, monkeypatch):  # noqa: F811
    """``bsz * heads`` = 4,097 x 16 = 65,552: CUDA would refuse it on grid axis 1 (at most 65,535),
    where the kernels had it. Every launch here is checked against CUDA's limits; the interpreter
    runs the first two and the last two of the 65,552 programs (all of them take minutes), and the
    output, new sum and every gradient of those heads equal the float64 reference, with dropout."""
    from triton.runtime import interpreter

    module, device = kernels
    if device != "cpu":
        pytest.skip("the interpreter's grid is what this test shortens")
    grids = []
    set_grid_dim = interpreter.InterpreterBuilder.set_grid_dim

    def checked(self, nx, ny, nz):
        grids.append((nx, ny, nz))
        assert all(n <= most for n, most in zip((nx, ny, nz), CUDA_GRID)), f"CUDA refuses grid {(nx, ny, nz)}"
        set_grid_dim(self, nx, ny, nz)

    def ends(*args):  # the grid loops' range: only its first two and last two programs
        n = range(*args)
        return n if len(n) <= 8 else [n[0], n[1], n[-2], n[-1]]

    call = interpreter.GridExecutor.__call__  # the launch, its `range` (the grid loops' alone) shortened
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", types.FunctionType(
        call.__code__, dict(call.__globals__, range=ends), call.__name__, call.__defaults__, call.__closure__))
    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_dim", checked)
    bsz, heads, tgt_len, src_len, dim, p = 4097, 16, 2, 3, 16, 0.2
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, bsz, heads, dim, generator=g).permute(1, 2, 0, 3) for n in (tgt_len, src_len, src_len))
    prev = torch.randn(bsz, heads, tgt_len, src_len, generator=g)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[-1, 0] = True
    dout = torch.randn(bsz, heads, tgt_len, dim, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, prev)]
    torch.manual_seed(3)
    out, a, _ = module.residual_attention(*leaves, pad, scale=0.25, dropout_p=p)
    (out * dout).sum().backward()
    assert max(x for x, _, _ in grids) == bsz * heads and all(y == 1 for _, y, _ in grids)
    torch.manual_seed(3)
    keep = module.keep_mask((bsz, heads, tgt_len, src_len), p, *module.philox_seed_offset(torch.device("cpu"), 0))
    for b, h in ((0, 0), (0, 1), (bsz - 1, heads - 2), (bsz - 1, heads - 1)):
        at = (slice(b, b + 1), slice(h, h + 1))
        mine = [t[at].double().requires_grad_(True) for t in (q, k, v, prev)]
        want_out, want_a = reference(*mine, pad[b:b + 1], False, 1.0, 0.25, keep[at].double(), p)
        (want_out * dout[at]).sum().backward()
        for got, want in zip([out[at], a[at]] + [t.grad[at] for t in leaves], [want_out, want_a] +
                             [t.grad for t in mine]):
            assert (got.double() - want).abs().max() < 1e-5, (b, h)


# --------------------------------------------------------------------------------------
# What auto runs on CUDA: float32 and CUDA graph capture run bias, said once
# --------------------------------------------------------------------------------------

def test_auto_runs_bias_in_float32_on_cuda_and_says_why_once(monkeypatch, caplog):
    cuda = torch.device("cuda")
    fake_cuda(monkeypatch)
    notes = ra.KernelNotes()
    with caplog.at_level(logging.WARNING, logger=triton_kernel.__name__):
        for _ in range(2):
            assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, dtype=torch.float32, head_dim=64,
                                  notes=notes) == "bias"
    said = [r.getMessage() for r in caplog.records]
    assert said == ["residual attention kernel 'triton' does not apply here (auto does not choose it in float32 on "
                    "CUDA: its IEEE float32 dot products use no tensor cores (an earlier version took 86 s for 25 "
                    "updates on an H100 where bias took 7 s); --residual-attention-kernel triton runs it): such calls "
                    "run 'bias' (said once per model)"], said
    for dtype in (torch.float16, torch.bfloat16):
        assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, dtype=dtype, head_dim=64) == "triton"
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)  # --amp: half in the kernel
    assert ra.auto_kernel(device=cuda, training_dropout=True, terms=2, dtype=torch.float32, head_dim=64) == "triton"


def test_cuda_graph_capture_runs_bias_under_auto_and_triton_refuses_it(monkeypatch, caplog):
    """While a CUDA graph is captured (faked: ``torch.cuda.is_current_stream_capturing``), torch's
    Philox offset cannot be read, nor the probe wait: ``auto`` runs ``bias`` and an explicit
    ``triton`` refuses the call, each said in one line; after capture ``triton`` again."""
    cuda = torch.device("cuda")
    fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with caplog.at_level(logging.WARNING, logger=triton_kernel.__name__):
        notes = ra.KernelNotes()
        for _ in range(2):
            assert ra.auto_kernel(device=cuda, training_dropout=True, terms=1, dtype=torch.float16, head_dim=64,
                                  notes=notes) == "bias"
        query = types.SimpleNamespace(device=cuda, dtype=torch.float16)  # what the choice reads of a query
        assert stack_module(kernel="triton")._choose_kernel(query, 1) == "bias"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("a CUDA graph is being captured" in m and "'bias'" in m for m in said), said
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert ra.auto_kernel(device=cuda, training_dropout=True, terms=1, dtype=torch.float16, head_dim=64) == "triton"
