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
