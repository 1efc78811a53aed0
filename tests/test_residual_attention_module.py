"""The attention module alone: what it returns, where masks go, sum vs mean, and that
every kernel computes the same thing."""

import math

import pytest
import torch
from conftest import attend

from realformer_nmt.modules import ResidualMultiheadAttention, ResidualState

B, H, T, C = 2, 4, 5, 16
KERNELS = ["materialized", "bias"]


def module(mode="sum", kernel="materialized", **kw):
    torch.manual_seed(0)
    return ResidualMultiheadAttention(
        C, H, self_attention=True, residual=True, mode=mode, kernel=kernel, **kw
    ).eval()


def raw_scores(m, x):
    """Q K^T / sqrt(d_head), written out: [B, H, T, T]."""
    d = C // H
    q = torch.nn.functional.linear(x, m.q_proj.weight, m.q_proj.bias)
    k = torch.nn.functional.linear(x, m.k_proj.weight, m.k_proj.bias)
    q = q.view(T, B, H, d).permute(1, 2, 0, 3)
    k = k.view(T, B, H, d).permute(1, 2, 0, 3)
    return q @ k.transpose(-1, -2) / math.sqrt(d)


def randn(*shape, seed, requires_grad=False):
    """Inputs from their own generator: the same numbers whatever ran before."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(requires_grad)


@pytest.fixture
def x():
    return randn(T, B, C, seed=1)


def test_returns_unmasked_running_sum(x):
    m = module()
    prev = randn(B, H, T, T, seed=2)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, :2] = True
    causal = torch.full((T, T), float("-inf")).triu(1)
    with torch.no_grad():
        _, _, state = attend(m, x, x, x, key_padding_mask=pad, attn_mask=causal,
                             prev_state=ResidualState.of_scores(prev))
    scores = state.scores
    assert scores.shape == (B, H, T, T) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all()  # masks are not accumulated
    assert (scores - (raw_scores(m, x) + prev)).abs().max() < 1e-5
    assert state.terms == 2


@pytest.mark.parametrize("mode,n", [("sum", 3), ("mean", 3), ("mean", 1)])
def test_probabilities_are_softmax_of_masked_sum_over_c_n(x, mode, n):
    """c_n is the number of layers in the sum: the previous state's count plus one."""
    m = module(mode)
    prev = randn(B, H, T, T, seed=3)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 0] = True
    state = ResidualState.of_scores(prev, terms=n - 1) if n > 1 else None
    with torch.no_grad():
        _, probs, _ = attend(m, x, x, x, key_padding_mask=pad, prev_state=state, need_head_weights=True)
    c_n = n if mode == "mean" else 1
    total = raw_scores(m, x) + (prev if n > 1 else 0)
    logits = (total / c_n).masked_fill(pad[:, None, None, :], float("-inf"))
    want = torch.softmax(logits, -1).transpose(0, 1)  # fairseq's [H, B, T, S]
    assert (probs - want).abs().max() < 1e-6


def stack(kernel, mode, layers=4):
    torch.manual_seed(0)
    return [ResidualMultiheadAttention(C, H, self_attention=True, residual=True, mode=mode, kernel=kernel)
            for _ in range(layers)]


def run_stack(mods, x, **kw):
    state, outs = None, []
    for m in mods:
        out, _, state = attend(m, x, x, x, prev_state=state, need_weights=False, **kw)
        outs.append(out)
        x = out
    return torch.stack(outs), state


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "causal+padding", "fully-padded-row"])
def test_fused_kernel_equals_materialized(x, mode, masks):
    """Forward values everywhere, and gradients of a loss over the real (non-padded)
    query positions, as fairseq's criteria compute it, for a 4-layer stack. (A row whose
    every allowed key is padding has no defined gradient: materialized passes none,
    SDPA that of a uniform softmax; no loss ever reads such a row.)"""
    pad = attn_mask = None
    if "padding" in masks or masks == "fully-padded-row":
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, :2] = True
        pad[1, -1] = True
        if masks == "fully-padded-row":
            pad[1] = True
    if "causal" in masks:
        attn_mask = torch.full((T, T), float("-inf")).triu(1)
    results = {}
    for kernel in KERNELS:
        mods = stack(kernel, mode)
        xin = x.clone().requires_grad_(True)
        outs, state = run_stack(mods, xin, key_padding_mask=pad, attn_mask=attn_mask)
        assert state.terms == len(mods)
        real = torch.ones(T, B) if pad is None else (~pad).t().float()
        (outs.pow(2) * real[None, :, :, None]).sum().backward()
        results[kernel] = (outs.detach(), state.running_sum().detach(), xin.grad,
                           [p.grad for m in mods for p in m.parameters()])
    (o1, s1, g1, p1), (o2, s2, g2, p2) = results.values()
    assert torch.isfinite(o1).all()
    assert (o1 - o2).abs().max() < 1e-5
    assert (s1 - s2).abs().max() < 1e-4
    assert (g1 - g2).abs().max() < 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(p1, p2)) < 1e-5


def test_a_bias_path_runs_materialized_where_weights_are_requested(x):
    """Weights need the probabilities: that call materializes A_n once, and the rest of
    the path continues with the same values."""
    fused, ref = stack("bias", "mean", 3), stack("materialized", "mean", 3)
    with torch.no_grad():
        s_f = s_r = None
        for i, (mf, mr) in enumerate(zip(fused, ref)):
            need = i == 1
            of, wf, s_f = attend(mf, x, x, x, prev_state=s_f, need_weights=need)
            orf, wr, s_r = attend(mr, x, x, x, prev_state=s_r, need_weights=need)
            assert (of - orf).abs().max() < 1e-5
            if need:
                assert (wf - wr).abs().max() < 1e-6
        assert (s_f.running_sum() - s_r.scores).abs().max() < 1e-4


def test_auto_kernel_computes_the_same_function(x):
    with torch.no_grad():
        a, _ = run_stack(stack("auto", "mean"), x)
        m, _ = run_stack(stack("materialized", "mean"), x)
    assert (a - m).abs().max() < 1e-5


def test_off_path_module_is_fairseqs_and_refuses_a_state(x):
    m = ResidualMultiheadAttention(C, H, self_attention=True, residual=False)
    with torch.no_grad():
        out, _, state = attend(m, x, x, x)
    assert state is None and out.shape == (T, B, C)
    with pytest.raises(ValueError, match="not on a residual path"):
        attend(m, x, x, x, prev_state=ResidualState.of_scores(torch.zeros(B, H, T, T)))


@pytest.mark.parametrize("kernel", KERNELS)
def test_wrong_prev_shape_is_an_error(x, kernel):
    m = module(kernel=kernel)
    prev = ResidualState.of_scores(torch.zeros(B, H, T, T + 1))
    with pytest.raises(ValueError, match="expected"):
        attend(m, x, x, x, prev_state=prev)


@pytest.mark.parametrize("kernel", KERNELS)
def test_fully_padded_row_gives_no_nan(x, kernel):
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0] = True
    with torch.no_grad():
        out, _, state = attend(module(kernel=kernel), x, x, x, key_padding_mask=pad, need_weights=False)
    assert torch.isfinite(out).all() and torch.isfinite(state.running_sum()).all()


def test_unknown_mode_and_kernel_are_rejected():
    with pytest.raises(ValueError, match="mode"):
        module(mode="max")
    with pytest.raises(ValueError, match="kernel"):
        module(kernel="flash")


@pytest.mark.parametrize("kernel", KERNELS)
def test_gradients_flow_through_the_residual(x, kernel):
    m = module(kernel=kernel).train()
    prev = randn(B, H, T, T, seed=4, requires_grad=True)
    state = ResidualState.of_scores(prev)
    out, _, new = attend(m, x, x, x, prev_state=state, need_weights=False)
    (out.sum() + new.running_sum().sum()).backward()
    assert prev.grad is not None and prev.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_sdpa_causal_right_padding_equals_materialized_on_every_row(x, mode):
    """is_causal lets padded queries see the padded keys before them; the bias kernel's
    first layer redoes those rows, so every row (real and padded) and every gradient is the
    materialized kernel's."""
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, -2:] = True
    pad[1, -1:] = True
    causal = torch.full((T, T), float("-inf")).triu(1)
    results = []
    for kernel in KERNELS:
        mods = stack(kernel, mode)
        xin = x.clone().requires_grad_(True)
        outs, _ = run_stack(mods, xin, key_padding_mask=pad, attn_mask=causal)
        outs.pow(2).sum().backward()
        results.append((outs.detach(), xin.grad, [p.grad for m in mods for p in m.parameters()]))
    assert (results[0][0] - results[1][0]).abs().max() < 1e-5
    assert (results[0][1] - results[1][1]).abs().max() < 1e-5
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(results[0][2], results[1][2]))


def test_auto_runs_materialized_on_cpu(x):
    """The rule written next to auto_kernel, as the module applies it."""
    m = ResidualMultiheadAttention(C, H, dropout=0.1, self_attention=True, residual=True, kernel="auto").train()
    assert m.kernel_for(x, x, None, False, None) == "materialized"
    assert m.eval().kernel_for(x, x, None, False, None) == "materialized"
    assert m.kernel_for(x, x, {}, False, None) == "materialized"  # cached decoding
    assert m.kernel_for(x, x, None, True, None) == "materialized"  # weights requested


@pytest.mark.parametrize("residual", [False, True])
def test_fairseqs_own_layer_calls_it_and_gets_two_values(x, residual):
    """fairseq's ``TransformerEncoderLayerBase.forward`` calls its attention as
    ``x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=..., need_weights=False,
    attn_mask=...)``: with ours put in its place (the same weights; residual on or off) the
    call returns fairseq's two values and the layer computes what it computes with fairseq's
    own module (a first layer of a residual path attends to its own scores alone)."""
    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules import MultiheadAttention
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    cfg = TransformerConfig()
    cfg.encoder.embed_dim, cfg.encoder.ffn_embed_dim, cfg.encoder.attention_heads = C, 2 * C, H
    cfg.dropout = cfg.attention_dropout = 0.0
    torch.manual_seed(0)
    layer = TransformerEncoderLayerBase(cfg).eval()
    assert type(layer.self_attn) is MultiheadAttention
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.no_grad():
        want = layer(x, pad)
        ours = ResidualMultiheadAttention(C, H, self_attention=True, residual=residual)
        ours.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = ours.eval()
        returned = ours(query=x, key=x, value=x, key_padding_mask=pad, need_weights=False, attn_mask=None)
        got = layer(x, pad)
    assert isinstance(returned, tuple) and len(returned) == 2 and returned[1] is None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_state_travels_in_the_callers_container_only(x):
    """The module keeps no tensor of a call: the state is in the ResidualPath the caller
    passed (the previous one read from it, this layer's left in it), and a second call with
    that container adds to the running sum."""
    from realformer_nmt.modules.residual_attention import ResidualPath

    m = module()
    path = ResidualPath()
    with torch.no_grad():
        m(x, x, x, residual_path=path, need_weights=False)
        first = path.state
        m(x, x, x, residual_path=path, need_weights=False)
    assert first.terms == 1 and path.state.terms == 2
    torch.testing.assert_close(path.state.scores, 2 * first.scores)
    assert not any(isinstance(v, (torch.Tensor, ResidualState)) for k, v in vars(m).items()
                   if not k.startswith("_"))
