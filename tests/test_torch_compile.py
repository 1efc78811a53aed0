"""``torch.compile`` of a RealFormer on CPU computes what eager mode computes.

Two levels, to keep the file within a few minutes on a 2-core machine (inductor's C++
build of every kernel of a whole translation model takes minutes here: see
``realformer_tools/experiments/compile_check.py`` for the whole-model measurement):

* the whole ``realformer_transformer`` through TorchDynamo + AOTAutograd
  (``backend="aot_eager"``: the graph capture, guards, graph breaks and the traced
  backward, everything but code generation), forward and backward equal to eager, and
  no graph break beyond those of fairseq's own ``transformer``;
* the RealFormer attention path (bias layers, then a materialized one: both kernels
  and the switch between them, with padding and a causal mask) through the default
  backend, inductor, which generates and compiles C++: equal to eager within 1e-5.

Dropout is off: compiled code draws its own random numbers, so only dropout-free runs
are comparable number for number.
"""

import copy

import pytest
import torch
from conftest import attend, batch, build
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.exc import InvalidCxxCompiler

from realformer_nmt.modules import ResidualMultiheadAttention

TOL = 1e-5


def cxx_compiler_or_skip():
    """Inductor's CPU backend builds C++; skip (saying why) where no compiler is found.

    Only inductor's own "no compiler" error (``InvalidCxxCompiler``: no working compiler
    among ``torch._inductor.config.cpp.cxx`` / ``$CXX``) skips; anything else fails."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        return get_cpp_compiler()
    except InvalidCxxCompiler as exc:
        pytest.skip(f"torch.compile's CPU backend (inductor) needs a C++ compiler: {exc}")


def train_pass(model, src, lengths, tgt):
    logits, _ = model(src, lengths, tgt)
    logits.float().logsumexp(-1).mean().backward()
    return logits.detach()


def assert_same_gradients(eager, compiled, tol=TOL):
    pairs = list(zip(eager.named_parameters(), compiled.parameters()))
    assert pairs
    for (name, p), q in pairs:
        assert q.grad is not None, name
        assert (p.grad - q.grad).abs().max() <= tol, name


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def count_graphs(model, *inputs, backend="eager"):
    counter = CompileCounterWithBackend(backend)
    torch.compile(model, backend=counter)(*inputs)
    return counter.frame_count


@pytest.mark.slow  # 10-20 s under load: full suite only
def test_whole_model_compiles_to_eager_outputs_and_gradients_with_no_extra_graph_breaks(dictionary):
    src, lengths, tgt = batch(dictionary, bsz=4, src_len=9, tgt_len=8)
    eager = build(dictionary=dictionary).train()  # realformer_transformer, TINY: dropout 0
    twin = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    expected = train_pass(eager, src, lengths, tgt)
    got = train_pass(torch.compile(twin, backend=counter), src, lengths, tgt)
    assert (expected - got).abs().max() <= TOL
    assert_same_gradients(eager, twin)
    # graphs are split only where fairseq's own code branches on tensor values
    # (``if tokens.eq(pad).any()`` in the encoder and decoder): RealFormer adds no break
    # (its encoder reads ``has_pads`` once where fairseq's reads it at every layer: one fewer)
    torch._dynamo.reset()
    vanilla = build(arch="transformer", dictionary=dictionary).train()
    assert 1 <= counter.frame_count <= count_graphs(vanilla, src, lengths, tgt)


def attention_stack():
    torch.manual_seed(0)
    kernels = ["bias", "bias", "materialized"]  # a path may switch bias -> materialized
    return torch.nn.ModuleList(
        ResidualMultiheadAttention(16, 2, self_attention=True, residual=True, kernel=k, mode="mean")
        for k in kernels
    )


def run_stack(mods, x, key_padding_mask, attn_mask):
    state, h = None, x
    for m in mods:
        h, _, state = attend(m, h, h, h, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                        prev_state=state, need_weights=False)
    return h


def test_inductor_compiled_residual_attention_matches_eager():
    cxx_compiler_or_skip()
    x = torch.randn(7, 3, 16, generator=torch.Generator().manual_seed(4))  # T x B x C
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, :2] = True
    causal = torch.triu(torch.full((7, 7), float("-inf")), 1)
    eager = attention_stack()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(lambda h: run_stack(twin, h, pad, causal))

    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    he, hc = run_stack(eager, xe, pad, causal), compiled(xc)
    assert he.shape == hc.shape and torch.isfinite(hc).all()
    assert (he - hc).abs().max() <= TOL
    he.pow(2).mean().backward()
    hc.pow(2).mean().backward()
    assert (xe.grad - xc.grad).abs().max() <= TOL
    assert_same_gradients(eager, twin)
