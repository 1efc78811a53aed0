"""The ``bias`` kernel's SDPA backend: a mask that needs a gradient runs only on a backend
that returns it (or the call runs ``materialized``), and the probe behind ``auto``'s CUDA
choice answers the same whatever context first asks (issue 23, items 2 and 3).

No CUDA here: the backend list is the seam. On CPU the memory-efficient backend refuses
every call, which is exactly a refusing backend; the math kernel accepts and returns the
mask's gradient, which is exactly an accepting one.
"""

import contextlib
import logging

import pytest
import test_kernels_agree as kernels_agree
import torch
import torch.nn.attention as attention
import torch.nn.functional as F
from conftest import attend
from test_kernels_agree import forward_backward, masks, stack
from torch.nn.attention import SDPBackend
from torch.utils.checkpoint import checkpoint

from realformer_nmt.modules import residual_attention as ra

T, B, C = 6, 3, 16


def test_mask_gradient_backends_are_memory_efficient_on_cuda_and_math_on_cpu():
    assert ra.mask_grad_backends(torch.device("cuda")) == [SDPBackend.EFFICIENT_ATTENTION]
    assert ra.mask_grad_backends(torch.device("cpu")) == [SDPBackend.MATH]


def recording_sdpa_kernel(monkeypatch):
    """Patch ``sdpa_kernel``: record the backends each entry restricts to, and for every SDPA
    call whether it ran inside such a restriction."""
    entered, calls, depth = [], [], [0]
    real_kernel, real_sdpa = attention.sdpa_kernel, F.scaled_dot_product_attention

    @contextlib.contextmanager
    def kernel(backends, *args, **kwargs):
        entered.append(list(backends))
        depth[0] += 1
        try:
            with real_kernel(backends, *args, **kwargs):
                yield
        finally:
            depth[0] -= 1

    def sdpa(q, k, v, attn_mask=None, **kw):
        calls.append((attn_mask is not None and attn_mask.requires_grad, depth[0] > 0))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(attention, "sdpa_kernel", kernel)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    return entered, calls


def test_bias_sdpa_with_a_mask_gradient_runs_inside_the_restriction(monkeypatch):
    entered, calls = recording_sdpa_kernel(monkeypatch)
    pad, attn_mask = masks("padding")
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(5))
    outs, _, xgrad, grads = forward_backward("bias", "mean", pad, attn_mask, x)
    mask_grad_calls = [inside for needs_grad, inside in calls if needs_grad]
    assert len(mask_grad_calls) == 3  # layers 2-4 of the stack add the previous sum
    assert all(mask_grad_calls), calls
    assert entered == [[SDPBackend.MATH]] * 3
    # and the result is still materialized's, values and every gradient
    want, _, want_xgrad, want_grads = forward_backward("materialized", "mean", pad, attn_mask, x)
    assert (outs - want).abs().max() < 1e-5
    assert (xgrad - want_xgrad).abs().max() < 1e-4
    for got, ref in zip(grads, want_grads):
        assert (got - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_bias_sdpa_without_a_mask_gradient_is_not_restricted(monkeypatch):
    entered, calls = recording_sdpa_kernel(monkeypatch)
    mods = stack("bias", "sum", layers=3)
    x = torch.randn(T, B, C)
    with torch.no_grad():
        state = None
        for m in mods:
            x, _, state = attend(m, x, x, x, prev_state=state, need_weights=False)
    assert entered == [] and len(calls) == 3


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_a_refusing_backend_makes_the_call_materialized_with_every_gradient_logged_once(monkeypatch, caplog, mode):
    # the memory-efficient backend refuses every call on CPU: a backend that refuses
    monkeypatch.setattr(ra.sdpa_probe, "mask_grad_backends", lambda device: [SDPBackend.EFFICIENT_ATTENTION])
    ran = []
    real = ra.ResidualMultiheadAttention._materialized_forward

    def materialized(self, *args):
        ran.append(self)
        return real(self, *args)

    monkeypatch.setattr(ra.ResidualMultiheadAttention, "_materialized_forward", materialized)
    pad, attn_mask = masks("causal+left")
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(7))
    notes = ra.KernelNotes()  # one model's notes, for both calls' layers (share_kernel_notes)
    real_stack = kernels_agree.stack

    def one_model(*args, **kwargs):
        mods = real_stack(*args, **kwargs)
        for m in mods:
            m.notes = notes
        return mods

    monkeypatch.setattr(kernels_agree, "stack", one_model)
    with caplog.at_level(logging.WARNING, logger=ra.__name__):
        outs, total, xgrad, grads = forward_backward("bias", mode, pad, attn_mask, x)
        forward_backward("bias", mode, pad, attn_mask, x)
    assert len(ran) == 6  # layers 2-4, twice: every refused call ran materialized
    fallbacks = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    # said once per model (its three refusing layers, twice: one line), as a fairseq model shares its notes
    assert len(fallbacks) == 1 and "EFFICIENT_ATTENTION" in fallbacks[0], fallbacks
    ran.clear()
    want, want_total, want_xgrad, want_grads = forward_backward("materialized", mode, pad, attn_mask, x)
    assert (outs - want).abs().max() < 1e-5 and (total - want_total).abs().max() < 1e-4
    assert (xgrad - want_xgrad).abs().max() < 1e-4
    for got, ref in zip(grads, want_grads):  # q_proj / k_proj of every layer included
        assert got is not None and (got - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_an_unrelated_sdpa_error_is_raised_not_hidden(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(F, "scaled_dot_product_attention", broken)
    mods = stack("bias", "sum", layers=2)
    x = torch.randn(T, B, C, requires_grad=True)
    state = ra.ResidualState.of_scores(torch.zeros(B, 4, T, T, requires_grad=True))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        attend(mods[1], x, x, x, prev_state=state, need_weights=False)


# --------------------------------------------------------------------------------------
# the probe: the same answer under no_grad and inside a checkpointed layer
# --------------------------------------------------------------------------------------


@pytest.fixture
def probe(monkeypatch):
    """``_bias_backend_probe`` on the CPU with a fake backend list (``accepting``: the math
    kernel, which returns the mask's gradient; else the memory-efficient one, which refuses)."""

    def use(accepting):
        backends = [SDPBackend.MATH] if accepting else [SDPBackend.EFFICIENT_ATTENTION]
        monkeypatch.setattr(ra.sdpa_probe, "mask_grad_backends", lambda device: backends)
        ra.sdpa_probe._bias_backend_probe.cache_clear()
        return lambda: ra.sdpa_probe._bias_backend_probe("cpu")

    yield use
    ra.sdpa_probe._bias_backend_probe.cache_clear()


def in_a_checkpointed_layer(fn, use_reentrant):
    answers = []

    def layer(x):
        answers.append(fn())
        return x * 2

    x = torch.ones(3, requires_grad=True)
    checkpoint(layer, x, use_reentrant=use_reentrant).sum().backward()
    return answers[0]


@pytest.mark.parametrize("accepting", [True, False])
def test_probe_answer_does_not_depend_on_the_calling_context(probe, accepting, caplog):
    ask = probe(accepting)
    assert ask() is accepting  # plain context: the reference answer
    contexts = {
        "no_grad": lambda: torch.no_grad(),
        "inference_mode": lambda: torch.inference_mode(),
    }
    for name, make in contexts.items():
        ask = probe(accepting)
        with make():
            assert ask() is accepting, name
    for reentrant in (False, True):
        ask = probe(accepting)
        assert in_a_checkpointed_layer(ask, reentrant) is accepting, f"checkpoint use_reentrant={reentrant}"
    ask = probe(accepting)
    with caplog.at_level(logging.WARNING, logger=ra.__name__), torch.no_grad():
        ask()
    warned = any("does not take a float mask" in r.getMessage() for r in caplog.records)
    assert warned is (not accepting)  # no false warning from a no_grad caller
