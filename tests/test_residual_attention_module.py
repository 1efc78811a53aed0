"""The attention module alone: what it returns, where masks go, sum vs mean."""

import math

import pytest
import torch

from realformer_nmt.modules import ResidualMultiheadAttention

B, H, T, C = 2, 4, 5, 16


def module(mode="sum", layer_number=1, **kw):
    torch.manual_seed(0)
    return ResidualMultiheadAttention(
        C, H, self_attention=True, residual=True, mode=mode, layer_number=layer_number, **kw
    ).eval()


def raw_scores(m, x):
    """Q K^T / sqrt(d_head), written out: [B, H, T, T]."""
    d = C // H
    q = torch.nn.functional.linear(x, m.q_proj.weight, m.q_proj.bias)
    k = torch.nn.functional.linear(x, m.k_proj.weight, m.k_proj.bias)
    q = q.view(T, B, H, d).permute(1, 2, 0, 3)
    k = k.view(T, B, H, d).permute(1, 2, 0, 3)
    return q @ k.transpose(-1, -2) / math.sqrt(d)


@pytest.fixture
def x():
    return torch.randn(T, B, C, generator=torch.Generator().manual_seed(1))


def test_returns_unmasked_running_sum(x):
    m = module()
    prev = torch.randn(B, H, T, T)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, :2] = True
    causal = torch.full((T, T), float("-inf")).triu(1)
    with torch.no_grad():
        _, _, scores = m(x, x, x, key_padding_mask=pad, attn_mask=causal, prev_scores=prev)
    assert scores.shape == (B, H, T, T) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all()  # masks are not accumulated
    assert (scores - (raw_scores(m, x) + prev)).abs().max() < 1e-5


@pytest.mark.parametrize("mode,n", [("sum", 3), ("mean", 3), ("mean", 1)])
def test_probabilities_are_softmax_of_masked_sum_over_c_n(x, mode, n):
    m = module(mode, layer_number=n)
    prev = torch.randn(B, H, T, T)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 0] = True
    with torch.no_grad():
        _, probs, _ = m(x, x, x, key_padding_mask=pad, prev_scores=prev, need_head_weights=True)
    c_n = n if mode == "mean" else 1
    logits = ((raw_scores(m, x) + prev) / c_n).masked_fill(pad[:, None, None, :], float("-inf"))
    want = torch.softmax(logits, -1).transpose(0, 1)  # fairseq's [H, B, T, S]
    assert (probs - want).abs().max() < 1e-6


def test_off_path_module_is_fairseqs_and_refuses_scores(x):
    m = ResidualMultiheadAttention(C, H, self_attention=True, residual=False)
    with torch.no_grad():
        out, _, scores = m(x, x, x)
    assert scores is None and out.shape == (T, B, C)
    with pytest.raises(ValueError, match="not on a residual path"):
        m(x, x, x, prev_scores=torch.zeros(B, H, T, T))


def test_wrong_prev_shape_is_an_error(x):
    with pytest.raises(ValueError, match=r"expected \(2, 4, 5, 5\)"):
        module()(x, x, x, prev_scores=torch.zeros(B, H, T, T + 1))


def test_fully_padded_row_gives_no_nan(x):
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0] = True
    with torch.no_grad():
        out, _, scores = module()(x, x, x, key_padding_mask=pad)
    assert torch.isfinite(out).all() and torch.isfinite(scores).all()


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        module(mode="max")


def test_gradients_flow_through_the_residual(x):
    m = module().train()
    prev = torch.randn(B, H, T, T, requires_grad=True)
    out, _, scores = m(x, x, x, prev_scores=prev)
    (out.sum() + scores.sum()).backward()
    assert prev.grad is not None and prev.grad.abs().sum() > 0
