"""With residual paths off, realformer_transformer *is* fairseq's transformer."""

import argparse

import pytest
import torch
from conftest import batch, build
from fairseq.models import ARCH_CONFIG_REGISTRY

ARCH_PAIRS = [
    ("realformer_transformer", "transformer"),
    ("realformer_transformer_iwslt_de_en", "transformer_iwslt_de_en"),
    ("realformer_transformer_wmt_en_de", "transformer_wmt_en_de"),
    ("realformer_transformer_wmt_en_de_big", "transformer_wmt_en_de_big"),
]


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post_ln", "pre_ln"])
def test_paths_none_equals_fairseq_transformer(dictionary, normalize_before):
    ln = dict(encoder_normalize_before=normalize_before, decoder_normalize_before=normalize_before)
    ours = build(dictionary=dictionary, residual_attention_paths="none", seed=0, **ln)
    theirs = build("transformer", dictionary=dictionary, seed=1, **ln)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        a, extra_a = ours(src, lengths, tgt)
        b, extra_b = theirs(src, lengths, tgt)
        enc_a = ours.encoder(src, lengths)["encoder_out"][0]
        enc_b = theirs.encoder(src, lengths)["encoder_out"][0]
    assert (a - b).abs().max() < 1e-5
    assert (enc_a - enc_b).abs().max() < 1e-5
    assert (extra_a["attn"][0] - extra_b["attn"][0]).abs().max() < 1e-5  # alignment attention


def test_paths_none_training_step_equals_fairseq_transformer(dictionary):
    """Same loss and same gradients in training mode (dropout off)."""
    ours = build(dictionary=dictionary, residual_attention_paths="none").train()
    theirs = build("transformer", dictionary=dictionary).train()
    theirs.load_state_dict(ours.state_dict())
    src, lengths, tgt = batch(dictionary)
    losses = []
    for model in (ours, theirs):
        logits, _ = model(src, lengths, tgt)
        loss = logits.logsumexp(-1).mean() - logits[..., 5].mean()
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-6
    grads_b = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert (p.grad - grads_b[name].grad).abs().max() < 1e-5, name


@pytest.mark.parametrize("ours,theirs", ARCH_PAIRS)
def test_architectures_have_fairseq_dims_and_defaults(ours, theirs):
    a, b = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[ours](a)
    ARCH_CONFIG_REGISTRY[theirs](b)
    va, vb = vars(a), vars(b)
    assert {k: va[k] for k in vb} == vb
    assert va["residual_attention_paths"] == "encoder,decoder,cross"
    assert va["residual_attention_mode"] == "sum"


def test_default_paths_follow_the_model(dictionary):
    """No cross-attention, no cross path: the default never names a missing attention."""
    args = argparse.Namespace(no_cross_attention=True)
    ARCH_CONFIG_REGISTRY["realformer_transformer"](args)
    assert args.residual_attention_paths == "encoder,decoder"


def test_vanilla_transformer_weights_load_into_realformer(dictionary):
    """Warm start: a fairseq transformer's state dict loads strictly, and residual
    attention then changes what the same weights compute."""
    vanilla = build("transformer", dictionary=dictionary, seed=3)
    ours = build(dictionary=dictionary, seed=4)
    ours.load_state_dict(vanilla.state_dict(), strict=True)
    for (na, pa), (nb, pb) in zip(ours.state_dict().items(), vanilla.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        assert (ours(src, lengths, tgt)[0] - vanilla(src, lengths, tgt)[0]).abs().max() > 1e-3


def test_parameter_names_are_fairseqs(dictionary):
    names = set(build(dictionary=dictionary).state_dict())
    for expected in [
        "encoder.layers.0.self_attn.q_proj.weight",
        "encoder.layers.0.self_attn.out_proj.bias",
        "encoder.layers.2.self_attn_layer_norm.weight",
        "decoder.layers.1.encoder_attn.k_proj.weight",
        "decoder.layers.1.encoder_attn_layer_norm.bias",
        "decoder.layers.0.self_attn.v_proj.weight",
        "decoder.output_projection.weight",
    ]:
        assert expected in names


def _same_weights_pair(dictionary, **overrides):
    """Ours with paths none and fairseq's transformer, holding the same weights."""
    ours = build(dictionary=dictionary, residual_attention_paths="none", seed=0, **overrides)
    theirs = build("transformer", dictionary=dictionary, seed=1, **overrides)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_encoder_fc_results_are_fairseqs(dictionary):
    """``fc_results`` in the encoder's output dict as fairseq's encoder gives it: empty
    without ``return_all_hiddens``; with it one entry per layer, None unless the encoder
    was built with ``return_fc`` (as data2vec builds it), then ``fc2``'s output."""
    from fairseq.models.transformer import TransformerEncoderBase

    from realformer_nmt.models.realformer_transformer import RealFormerTransformerEncoder

    ours, theirs = _same_weights_pair(dictionary, encoder_layers=3)
    src, lengths, _ = batch(dictionary)
    with torch.no_grad():
        for hiddens in (False, True):
            a = ours.encoder(src, lengths, return_all_hiddens=hiddens)
            b = theirs.encoder(src, lengths, return_all_hiddens=hiddens)
            assert set(a) == set(b)
            assert a["fc_results"] == b["fc_results"] == ([None] * 3 if hiddens else [])
            assert len(a["encoder_states"]) == len(b["encoder_states"]) == (4 if hiddens else 0)
            for x, y in zip(a["encoder_states"], b["encoder_states"]):
                assert (x - y).abs().max() < 1e-5

    # return_fc: each layer's fc2 output before dropout, as fairseq's layers return it
    enc_a = RealFormerTransformerEncoder(ours.encoder.cfg, dictionary, ours.encoder.embed_tokens,
                                         return_fc=True).eval()
    enc_b = TransformerEncoderBase(theirs.encoder.cfg, dictionary, theirs.encoder.embed_tokens,
                                   return_fc=True).eval()
    enc_a.load_state_dict(ours.encoder.state_dict())
    enc_b.load_state_dict(ours.encoder.state_dict())
    assert all(layer.return_fc for layer in enc_a.layers)
    with torch.no_grad():
        a = enc_a(src, lengths, return_all_hiddens=True)
        b = enc_b(src, lengths, return_all_hiddens=True)
        assert enc_a(src, lengths)["fc_results"] == []
    assert len(a["fc_results"]) == len(b["fc_results"]) == 3
    for x, y in zip(a["fc_results"], b["fc_results"]):
        assert x is not None and x.shape == (src.size(1), src.size(0), 16)
        assert (x - y).abs().max() < 1e-5
    assert (a["encoder_out"][0] - b["encoder_out"][0]).abs().max() < 1e-5


def _cross_attn_weights(model, src, lengths, tgt):
    """Each decoder layer's returned attention, the layers called one by one as
    fairseq's decoder calls them."""
    decoder = model.decoder
    encoder_out = model.encoder(src, lengths)
    x = decoder.embed_scale * decoder.embed_tokens(tgt)
    x = x + decoder.embed_positions(tgt)
    x = x.transpose(0, 1)
    mask = decoder.buffered_future_mask(x)
    out = []
    for layer in decoder.layers:
        result = layer(x, encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0],
                       self_attn_mask=mask)
        x, attn = result[0], result[1]
        out.append(attn)
    return out


def test_decoder_layer_honours_need_attn_as_fairseqs(dictionary):
    """The decoder layer returns its cross-attention weights exactly when fairseq's does:
    in eval mode while ``need_attn`` is set (fairseq's default), not after
    ``make_generation_fast_(need_attn=False)`` (fairseq-generate without
    --print-alignment), not in training mode; the weights are fairseq's."""
    ours, theirs = _same_weights_pair(dictionary, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                                      activation_dropout=0.0)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        a, b = _cross_attn_weights(ours, src, lengths, tgt), _cross_attn_weights(theirs, src, lengths, tgt)
        assert all(w is not None for w in b)  # fairseq's eval default: every layer's
        assert all(w is not None for w in a)
        for x, y in zip(a, b):
            assert x.shape == y.shape and (x - y).abs().max() < 1e-6
        for model in (ours, theirs):
            model.make_generation_fast_(need_attn=False)
            assert not any(layer.need_attn for layer in model.decoder.layers)
        assert _cross_attn_weights(theirs, src, lengths, tgt) == [None, None]
        assert _cross_attn_weights(ours, src, lengths, tgt) == [None, None]
        # the decoder's alignment attention does not depend on need_attn, in either
        _, extra_a = ours(src, lengths, tgt)
        _, extra_b = theirs(src, lengths, tgt)
        assert (extra_a["attn"][0] - extra_b["attn"][0]).abs().max() < 1e-6
        for model in (ours, theirs):
            model.make_generation_fast_(need_attn=True)
            torch.nn.Module.train(model)  # fairseq's make_generation_fast_ blocks model.train()
        assert _cross_attn_weights(theirs, src, lengths, tgt) == [None, None]
        assert _cross_attn_weights(ours, src, lengths, tgt) == [None, None]
