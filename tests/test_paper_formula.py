"""The model computes the paper's formula: checked against tests/paper_reference.py,
a plain re-derivation on the model's own weights, path by path."""

import paper_reference as ref
import pytest
import torch
from conftest import batch, build

PATH_SETS = ["encoder", "decoder", "cross", "encoder,decoder,cross", "none"]
KERNELS = ["materialized", "bias", "auto"]


def reference_logits(model, src, tgt, paths, mode, pre_ln=False):
    params = dict(model.named_parameters())  # live parameters: the reference is differentiable
    enc_m, dec_m = model.encoder, model.decoder
    src_pad = src.eq(enc_m.padding_idx)
    x = enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)
    x = x * (~src_pad).unsqueeze(-1)  # fairseq zeroes padded positions
    layers, heads = len(enc_m.layers), enc_m.layers[0].self_attn.num_heads
    enc = ref.encoder(params, x, src_pad, layers, heads, paths, mode, pre_ln)
    y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
    feats = ref.decoder(params, y, enc, src_pad, len(dec_m.layers), heads, paths, mode, pre_ln)
    return enc, feats @ dec_m.output_projection.weight.t()


LAYER_NORMS = {"post-ln": False, "pre-ln": True}


def build_ln(dictionary, ln, **overrides):
    pre_ln = LAYER_NORMS[ln]
    return build(dictionary=dictionary, encoder_normalize_before=pre_ln, decoder_normalize_before=pre_ln,
                 **overrides)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ln", LAYER_NORMS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("paths", PATH_SETS)
def test_model_matches_paper_formula(dictionary, paths, mode, ln, kernel):
    """In training mode (dropout is 0 here) every path runs the chosen kernel; in eval
    mode the cross attention of fairseq's alignment layer (the last) returns weights and
    so runs materialized, the other layers the chosen kernel (tests/test_kernels_agree.py)."""
    model = build_ln(dictionary, ln, residual_attention_paths=paths, residual_attention_mode=mode,
                     residual_attention_kernel=kernel).train()
    src, lengths, tgt = batch(dictionary)
    want_paths = set() if paths == "none" else set(paths.split(","))
    with torch.no_grad():
        enc_out = model.encoder(src, lengths)
        logits, _ = model(src, lengths, tgt)
        want_enc, want_logits = reference_logits(model, src, tgt, want_paths, mode, LAYER_NORMS[ln])
    got_enc = enc_out["encoder_out"][0].transpose(0, 1)
    real = ~src.eq(dictionary.pad())  # padded encoder rows are never read
    assert (got_enc - want_enc)[real].abs().max() < 1e-5
    assert (logits - want_logits).abs().max() < 1e-5


def test_residual_paths_change_the_output(dictionary):
    """The formula tests above would pass trivially if paths were ignored."""
    src, lengths, tgt = batch(dictionary)
    outs = {}
    for paths in PATH_SETS:
        with torch.no_grad():
            outs[paths] = build(dictionary=dictionary, residual_attention_paths=paths)(src, lengths, tgt)[0]
    for paths in PATH_SETS[:-1]:
        assert (outs[paths] - outs["none"]).abs().max() > 1e-3, paths


def test_mean_mode_differs_from_sum(dictionary):
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        s = build(dictionary=dictionary, residual_attention_mode="sum")(src, lengths, tgt)[0]
        m = build(dictionary=dictionary, residual_attention_mode="mean")(src, lengths, tgt)[0]
    assert (s - m).abs().max() > 1e-3


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("ln", LAYER_NORMS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("paths", PATH_SETS)
def test_gradients_match_paper_formula(dictionary, paths, mode, ln, kernel):
    """Training sees the same gradients as the formula written out (dropout off), for
    every parameter, whichever paths carry residual scores."""
    model = build_ln(dictionary, ln, residual_attention_paths=paths, residual_attention_mode=mode,
                     residual_attention_kernel=kernel).train()
    src, lengths, tgt = batch(dictionary)
    want_paths = set() if paths == "none" else set(paths.split(","))
    model(src, lengths, tgt)[0].pow(2).mean().backward()
    # a parameter the gradient does not reach counts as a zero gradient (and differs below)
    got = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    _, want = reference_logits(model, src, tgt, want_paths, mode, LAYER_NORMS[ln])
    want.pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert (got[name] - p.grad).abs().max() < 1e-5, name
    assert len(got) == len(list(model.parameters()))


@pytest.mark.parametrize("kernel", KERNELS)
def test_padded_targets_match_paper_formula(dictionary, kernel):
    """Right-padded targets (fairseq's batches) put a padding mask on the decoder self
    path next to the causal mask; every real target position matches the formula."""
    model = build(dictionary=dictionary, residual_attention_mode="mean", residual_attention_kernel=kernel).train()
    src, lengths, tgt = batch(dictionary)
    tgt[0, -2:] = dictionary.pad()
    with torch.no_grad():
        logits, _ = model(src, lengths, tgt)
        _, want = reference_logits(model, src, tgt, {"encoder", "decoder", "cross"}, "mean")
    real = tgt.ne(dictionary.pad())
    assert (logits - want)[real].abs().max() < 1e-5
