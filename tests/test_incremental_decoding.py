"""Cached (incremental) decoding computes what the full pass computes."""

import pytest
import torch
from conftest import batch, build
from fairseq.sequence_generator import SequenceGenerator

CONFIGS = [
    dict(),
    dict(residual_attention_kernel="bias", residual_attention_mode="mean"),
    dict(residual_attention_kernel="bias", residual_attention_mode="mean"),
    dict(residual_attention_kernel="bias", cross_self_attention=True),
    dict(residual_attention_mode="mean"),
    dict(residual_attention_paths="decoder"),
    dict(residual_attention_paths="cross"),
    dict(residual_attention_paths="none"),
    dict(decoder_normalize_before=True, encoder_normalize_before=True),
]


def step_by_step(model, enc, tgt, reorder_at=None, new_order=None):
    """Decode ``tgt`` one step at a time; optionally reorder the cache like a beam."""
    state, outs = {}, []
    for t in range(tgt.size(1)):
        if t == reorder_at:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            enc = model.encoder.reorder_encoder_out(enc, new_order)
            tgt = tgt.index_select(0, new_order)
            outs = [o.index_select(0, new_order) for o in outs]
        logits, _ = model.decoder(tgt[:, : t + 1], enc, incremental_state=state)
        assert logits.size(1) == 1
        outs.append(logits)
    return torch.cat(outs, dim=1), tgt


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_incremental_matches_full_pass(dictionary, overrides):
    model = build(dictionary=dictionary, **overrides)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        full, _ = model(src, lengths, tgt)
        incremental, _ = step_by_step(model, model.encoder(src, lengths), tgt)
    assert (incremental - full).abs().max() < 1e-5


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_incremental_matches_full_pass_after_beam_reorder(dictionary, overrides):
    """Two sentences x three beams; mid-sentence the beams are reordered within each
    sentence, with repeats and drops, exactly as beam search does."""
    model = build(dictionary=dictionary, **overrides)
    src, lengths, tgt = batch(dictionary, bsz=6)
    beams = torch.tensor([0, 0, 0, 1, 1, 1])
    src, lengths = src[beams], lengths[beams]  # each sentence repeated per beam
    new_order = torch.tensor([1, 1, 0, 5, 3, 3])
    with torch.no_grad():
        incremental, reordered_tgt = step_by_step(model, model.encoder(src, lengths), tgt, 3, new_order)
        full, _ = model(src, lengths, reordered_tgt)
    assert not torch.equal(reordered_tgt, tgt)
    assert (incremental - full).abs().max() < 1e-5


@pytest.mark.parametrize("kernel", ["auto", "bias"])
def test_only_current_step_rows_flow_between_layers(dictionary, kernel):
    """In cached decoding each layer hands on [B, H, 1, S] rows, never the whole history,
    whatever the kernel setting (cached steps always run the materialized kernel)."""
    model = build(dictionary=dictionary, residual_attention_kernel=kernel)
    src, lengths, tgt = batch(dictionary)
    seen = []
    for layer in model.decoder.layers:
        layer.self_attn.register_forward_hook(
            lambda m, a, k, o: seen.append(("self", tuple(k["residual_path"].state.scores.shape))), with_kwargs=True)
        layer.encoder_attn.register_forward_hook(
            lambda m, a, k, o: seen.append(("cross", tuple(k["residual_path"].state.scores.shape))), with_kwargs=True)
    state = {}
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        for t in range(3):
            seen.clear()
            model.decoder(tgt[:, : t + 1], enc, incremental_state=state)
            assert ("self", (3, 4, 1, t + 1)) in seen
            assert all(shape[2] == 1 for _, shape in seen)
            assert ("cross", (3, 4, 1, src.size(1))) in seen


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_beam_search_scores_match_full_pass(dictionary, mode):
    """fairseq's SequenceGenerator (cached decoding, beam reorders every step) scores
    each hypothesis exactly as a full teacher-forced pass over it does."""
    model = build(dictionary=dictionary, residual_attention_mode=mode)
    src, lengths, _ = batch(dictionary)
    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=8, min_len=3)
    with torch.no_grad():
        hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
        checked = 0
        for i, beam in enumerate(hypos):
            for h in beam:
                tokens = h["tokens"].unsqueeze(0)
                prev = torch.cat([tokens.new_full((1, 1), dictionary.eos()), tokens[:, :-1]], dim=1)
                logits, _ = model(src[i : i + 1], lengths[i : i + 1], prev)
                lprobs = model.get_normalized_probs((logits, None), log_probs=True)
                want = lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze()
                assert (h["positional_scores"] - want).abs().max() < 1e-4
                checked += 1
    assert checked == 12
