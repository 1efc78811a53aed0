"""Attention analysis (entropy and adjacent-layer JSD per layer and head; the paper's
Figs 4-8): the formulas, the streaming statistics, padding, the probabilities read
from the model's own forward pass (against the paper formula written out), and the
script on tiny checkpoints trained by fairseq-train."""

import argparse
import inspect
import json
import math
import subprocess
import sys
import types

import numpy as np
import paper_reference as ref
import pytest
import torch
from cli_helpers import TINY_FLAGS
from conftest import REPO, USER_DIR, batch, build, cli_env, make_dictionary, trains
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from inprocess import run_in_process as run  # fairseq's tools in this process (tests/inprocess.py)

from realformer_nmt.errors import CheckpointFileError, DataError
from realformer_tools.experiments import attention_analysis as aa

SCRIPT = str(REPO / "scripts" / "analyze_attention.py")

# fairseq's own checkpoint loaders run in this process (the analysis loads checkpoints): with the fixes
pytestmark = pytest.mark.usefixtures("fairseq_fixes")
LN2 = math.log(2)
# the error bound the analysis promises for every streamed median and quartile (in its
# JSON, summary and docs): stated here, not read from the code under test
QUANTILE_BOUND = 1e-3  # nats


# --------------------------------------------------------------------------- formulas

@pytest.mark.parametrize("k", [1, 2, 5, 64])
def test_entropy_of_uniform_distribution_is_log_k(k):
    probs = torch.full((3, k), 1.0 / k)
    assert torch.allclose(aa.entropy(probs), torch.full((3,), math.log(k), dtype=torch.float64), atol=1e-12)


def test_entropy_of_one_hot_is_zero():
    assert aa.entropy(torch.eye(6)).abs().max() == 0


def test_jsd_of_identical_distributions_is_zero_and_of_disjoint_ones_ln2():
    p = torch.softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(0)), -1)
    assert aa.js_divergence(p, p).abs().max() == 0
    left = torch.tensor([[0.2, 0.8, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    right = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.0, 0.3, 0.3, 0.4]])
    assert torch.allclose(aa.js_divergence(left, right), torch.full((2,), LN2, dtype=torch.float64), atol=1e-12)


def test_jsd_equals_the_kl_definition():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=5), rng.dirichlet(np.ones(7) * 0.3, size=5)
    m = (p + q) / 2
    want = 0.5 * (p * np.log(p / m)).sum(1) + 0.5 * (q * np.log(q / m)).sum(1)
    got = aa.js_divergence(torch.tensor(p), torch.tensor(q)).numpy()
    assert np.abs(got - want).max() < 1e-12
    assert np.abs(aa.js_divergence(torch.tensor(q), torch.tensor(p)).numpy() - got).max() < 1e-12


# --------------------------------------------------------------------------- streaming statistics

def test_histogram_quantiles_are_within_one_bin_of_numpy():
    rng = np.random.default_rng(1)
    values = np.stack([rng.gamma(2.0, 0.6, 3000), rng.uniform(0, LN2, 3000), rng.exponential(0.01, 3000)])
    hist = aa.Histogram(3)
    for chunk in np.array_split(np.arange(3000), 7):  # streamed in uneven pieces
        hist.add(values[:, chunk])
    qs = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0]
    want = np.quantile(values, qs, axis=1).T
    assert np.abs(hist.quantiles(qs) - want).max() <= QUANTILE_BOUND
    assert (hist.total() == 3000).all()
    assert np.array_equal(hist.min, values.min(1)) and np.array_equal(hist.max, values.max(1))
    pooled = hist.pooled([0, 2])
    assert abs(pooled.median()[0] - np.median(values[[0, 2]])) <= QUANTILE_BOUND


def test_histogram_quantiles_of_sparse_and_constant_series():
    hist = aa.Histogram(3)
    hist.add(np.array([[0.0, 1.0], [0.0, 0.0], [0.3, 0.3]]))
    got = hist.quantiles((0.25, 0.5, 0.75))
    want = np.quantile(np.array([[0.0, 1.0], [0.0, 0.0], [0.3, 0.3]]), (0.25, 0.5, 0.75), axis=1).T
    assert np.abs(got - want).max() <= QUANTILE_BOUND
    assert got[1].tolist() == [0.0, 0.0, 0.0]  # one-hot attention: exactly 0, not a bin centre


def test_padded_queries_and_keys_never_counted():
    """A padded batch gives the same per-token values as each sentence alone; NaN in
    padded query rows would make the histogram refuse them; mass that a (broken) model
    put on padded keys is dropped and reported."""
    g = torch.Generator().manual_seed(2)
    lengths = [5, 3]
    L, H, T = 2, 3, 5
    singles = [[torch.softmax(torch.randn(1, H, n, n, generator=g), -1) for _ in range(L)] for n in lengths]
    real = torch.tensor([[True] * 5, [False, False, True, True, True]])  # left padded
    padded = []
    for layer in range(L):
        p = torch.full((2, H, T, T), float("nan"))
        p[0] = singles[0][layer][0]
        p[1, :, 2:, :] = 0.0
        p[1, :, 2:, 2:] = singles[1][layer][0] * 0.9
        p[1, :, 2:, 0] = 0.1  # 10% leaked onto a padded key
        padded.append(p)
    ent, jsd, pad_mass = aa.token_statistics(padded, real, real)
    want = [aa.token_statistics(s, torch.ones(1, n, dtype=torch.bool), torch.ones(1, n, dtype=torch.bool))
            for s, n in zip(singles, lengths)]
    assert ent.shape == (L, H, 8) and jsd.shape == (L - 1, H, 8)
    assert torch.allclose(ent, torch.cat([w[0] for w in want], -1), atol=1e-12)
    assert torch.allclose(jsd, torch.cat([w[1] for w in want], -1), atol=1e-12)
    assert abs(pad_mass - 0.1) < 1e-6
    with pytest.MonkeyPatch.context() as m:  # computed in chunks of a few rows: same values
        m.setattr(aa.estimators, "CHUNK_ELEMENTS", 7)  # where LayerStream reads it
        chunked = aa.token_statistics(padded, real, real)
    assert torch.equal(chunked[0], ent) and torch.equal(chunked[1], jsd)
    stats = aa.TypeStats(L, H)
    stats.add(padded, real, real)
    assert stats.tokens == 8 and (stats.entropy.total() == 8).all()


def _padded_batch(dictionary):
    src, lengths, tgt = batch(dictionary, bsz=3, src_len=7, tgt_len=6)
    tgt[0, -2:] = dictionary.pad()  # right-padded references, as fairseq collates them
    tgt[2, -1:] = dictionary.pad()
    return src, lengths, tgt


@pytest.mark.parametrize("arch,overrides", [
    ("realformer_transformer", {"residual_attention_mode": "sum"}),
    ("realformer_transformer", {"residual_attention_mode": "mean"}),
    ("transformer", {}),
])
def test_padding_does_not_change_what_the_model_is_measured_to_do(dictionary, arch, overrides):
    """End to end through the model: a padded batch yields the same per-token entropies
    and JSDs as each sentence run alone without padding."""
    model = build(arch, dictionary=dictionary, **overrides)
    src, lengths, tgt = _padded_batch(dictionary)
    pads = {"source": dictionary.pad(), "target": dictionary.pad()}

    def values(src, lengths, tgt):
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": tgt}}
        net_input, masks = aa.model_inputs(model, sample, pads)
        with aa.recording_attention(model) as record:
            probs, own = aa.attention_probabilities(model, record, net_input, own_scores=True)
        return {(t, source): aa.token_statistics(p[t], *masks[t]) for t in probs
                for source, p in (("used", probs), ("own", own))}

    together = values(src, lengths, tgt)
    alone = []
    for i in range(src.size(0)):
        s, t = src[i][src[i].ne(dictionary.pad())], tgt[i][tgt[i].ne(dictionary.pad())]
        alone.append(values(s[None], torch.tensor([len(s)]), t[None]))
    for t, (ent, jsd, pad_mass) in together.items():  # the attention used and the own-score control
        assert pad_mass == 0.0, t
        assert torch.allclose(ent, torch.cat([a[t][0] for a in alone], -1), atol=1e-5), t
        assert torch.allclose(jsd, torch.cat([a[t][1] for a in alone], -1), atol=1e-5), t
    together = {t: v for (t, source), v in together.items() if source == "used"}
    assert together["encoder_self"][0].shape[-1] == int(src.ne(dictionary.pad()).sum())
    assert together["cross"][0].shape[-1] == int(tgt.ne(dictionary.pad()).sum())


# --------------------------------------------------------------------------- the model's own probabilities

def _reference_probabilities(monkeypatch, fn):
    """Run the paper-formula reference and collect every softmax it takes (one per
    attention sub-layer, in execution order), without touching its code."""
    taken = []
    softmax = torch.softmax

    def recording_softmax(x, *args, **kwargs):
        out = softmax(x, *args, **kwargs)
        taken.append(out.detach())
        return out

    with monkeypatch.context() as m:
        m.setattr(torch, "softmax", recording_softmax)
        with torch.no_grad():
            fn()
    return taken


def _reference_translation(model, src, tgt, paths, mode):
    params = dict(model.named_parameters())
    enc_m, dec_m = model.encoder, model.decoder
    src_pad = src.eq(enc_m.padding_idx)
    x = enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)
    x = x * (~src_pad).unsqueeze(-1)
    heads = enc_m.layers[0].self_attn.num_heads
    enc = ref.encoder(params, x, src_pad, len(enc_m.layers), heads, paths, mode)
    y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
    ref.decoder(params, y, enc, src_pad, len(dec_m.layers), heads, paths, mode)


@pytest.mark.parametrize("arch,paths,mode", [
    ("realformer_transformer", "encoder,decoder,cross", "sum"),
    ("realformer_transformer", "encoder,decoder,cross", "mean"),
    ("realformer_transformer", "encoder,cross", "sum"),
    ("realformer_transformer", "none", "sum"),
    ("transformer", "none", "sum"),
])
def test_probabilities_read_equal_the_paper_formula(dictionary, monkeypatch, arch, paths, mode):
    overrides = {} if arch == "transformer" else dict(residual_attention_paths=paths, residual_attention_mode=mode)
    model = build(arch, dictionary=dictionary, **overrides)
    src, lengths, tgt = batch(dictionary)
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": tgt}
    with aa.recording_attention(model) as record:
        got = aa.attention_probabilities(model, record, net_input)
    want_paths = set() if paths == "none" else set(paths.split(","))
    taken = _reference_probabilities(monkeypatch, lambda: _reference_translation(model, src, tgt, want_paths, mode))
    layers = len(model.encoder.layers)
    want = {"encoder_self": taken[:layers], "decoder_self": taken[layers::2], "cross": taken[layers + 1::2]}
    src_real = src.ne(dictionary.pad())
    for t in aa.ATTENTION_TYPES:
        assert len(got[t]) == layers
        for g, w in zip(got[t], want[t]):
            assert g.shape == w.shape  # [B, H, T, S]: per head
            rows = src_real if t == "encoder_self" else torch.ones(tgt.shape, dtype=torch.bool)
            assert (g - w).abs().permute(0, 2, 1, 3)[rows].max() < 1e-5, t


def _own_scores_written_out(model, src, lengths, tgt):
    """Each attention layer's own probabilities softmax(mask(Q K^T / sqrt(d))), computed
    plainly from its q_proj/k_proj weights and the inputs it was called with (captured
    by a pre-hook), with its key padding and additive masks: ``{type: [B, H, T, S] per layer}``."""
    modules = aa.attention_modules(model)
    inputs = {t: [None] * len(ms) for t, ms in modules.items()}
    handles = []

    def capture(t, i, module, args, kwargs):
        call = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        inputs[t][i] = {k: call.get(k) for k in ("query", "key", "key_padding_mask", "attn_mask")}

    for t, ms in modules.items():
        for i, m in enumerate(ms):
            handles.append(m.register_forward_pre_hook(
                lambda mod, a, kw, t=t, i=i: capture(t, i, mod, a, kw), with_kwargs=True))
    try:
        with torch.no_grad():
            model(src, lengths, tgt)
    finally:
        for h in handles:
            h.remove()
    want = {}
    for t, ms in modules.items():
        want[t] = []
        for m, call in zip(ms, inputs[t]):
            heads = m.num_heads
            x_q = call["query"].transpose(0, 1)  # [B, T, C]
            x_k = (call["key"] if call["key"] is not None else call["query"]).transpose(0, 1)
            B, T, C = x_q.shape
            d = C // heads
            q = (x_q @ m.q_proj.weight.T + m.q_proj.bias).view(B, T, heads, d).transpose(1, 2)
            k = (x_k @ m.k_proj.weight.T + m.k_proj.bias).view(B, -1, heads, d).transpose(1, 2)
            scores = q @ k.transpose(-1, -2) / math.sqrt(d)  # [B, H, T, S]
            if call["attn_mask"] is not None:
                scores = scores + call["attn_mask"]
            if call["key_padding_mask"] is not None:
                scores = scores.masked_fill(call["key_padding_mask"].bool()[:, None, None, :], float("-inf"))
            want[t].append(torch.softmax(scores, dim=-1).detach())
    return want


@pytest.mark.parametrize("arch,paths,mode", [
    ("realformer_transformer", "encoder,decoder,cross", "sum"),
    ("realformer_transformer", "encoder,decoder,cross", "mean"),
    ("realformer_transformer", "encoder,cross", "sum"),
    ("realformer_transformer", "none", "sum"),
    ("transformer", "none", "sum"),
])
def test_own_score_probabilities_equal_the_q_and_k_projections_written_out(dictionary, arch, paths, mode):
    """The control: each layer's own-score probabilities equal softmax(mask(Q K^T / sqrt(d)))
    from its own q_proj/k_proj; they are the attention used wherever no running sum is
    added (fairseq's module, a path off, layer 1 of a path) and differ from it above."""
    overrides = {} if arch == "transformer" else dict(residual_attention_paths=paths, residual_attention_mode=mode)
    model = build(arch, dictionary=dictionary, **overrides)
    src, lengths, tgt = batch(dictionary)
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": tgt}
    with aa.recording_attention(model) as record:
        used, own = aa.attention_probabilities(model, record, net_input, own_scores=True)
    want = _own_scores_written_out(model, src, lengths, tgt)
    residual = set() if paths == "none" else set(paths.split(","))
    on_path = {"encoder_self": "encoder" in residual, "decoder_self": "decoder" in residual,
               "cross": "cross" in residual}
    src_real = src.ne(dictionary.pad())
    for t in aa.ATTENTION_TYPES:
        rows = src_real if t == "encoder_self" else torch.ones(tgt.shape, dtype=torch.bool)
        assert len(own[t]) == len(want[t]) == len(used[t]) == 3
        for layer, (o, w, u) in enumerate(zip(own[t], want[t], used[t])):
            assert o.shape == w.shape == u.shape  # [B, H, T, S]
            assert (o - w).abs().permute(0, 2, 1, 3)[rows].max() < 1e-5, (t, layer)
            difference = float((o - u).abs().permute(0, 2, 1, 3)[rows].max())
            if on_path[t] and layer > 0:
                assert difference > 1e-3, (t, layer)  # the running sum changes what the layer attends with
            else:
                assert torch.equal(o, u), (t, layer)
    # nothing left behind on the modules
    assert not any(getattr(m, "need_own_weights", False) or getattr(m, "own_weights", None) is not None
                   for m in model.modules())


def _statistics_of_a_batch(model, dictionary):
    src, lengths, tgt = _padded_batch(dictionary)
    pads = {"source": dictionary.pad(), "target": dictionary.pad()}
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": tgt}}
    net_input, masks = aa.model_inputs(model, sample, pads)
    with aa.recording_attention(model) as record:
        used, own = aa.attention_probabilities(model, record, net_input, own_scores=True)
    return used, own, masks


@pytest.mark.parametrize("arch", ["realformer_transformer", "transformer"])
def test_json_and_summary_carry_the_own_score_control_beside_the_attention_used(dictionary, arch):
    model = build(arch, dictionary=dictionary)
    used, own, masks = _statistics_of_a_batch(model, dictionary)
    analysis = aa.Analysis(checkpoint="model.pt", label=arch, types={})
    for t in used:
        stats = aa.TypeStats(3, 4)
        stats.add(used[t], *masks[t], own_probs=own[t])
        analysis.types[t] = stats
    result = analysis.to_json()
    assert set(result["statistic_sets"]) == {"used", "own_scores"}
    for t in aa.ATTENTION_TYPES:
        s = result[t]
        assert set(s) == {"entropy_median", "entropy_quartiles", "jsd_median", "jsd_quartiles", "own_scores"}
        assert set(s["own_scores"]) == {"entropy_median", "entropy_quartiles", "jsd_median", "jsd_quartiles",
                                        "max_abs_difference_from_used"}
        for source, probs in (("used", used[t]), ("own", own[t])):
            ent, jsd, _ = aa.token_statistics(probs, *masks[t])  # exact per-token values
            got = s if source == "used" else s["own_scores"]
            for stat, values in (("entropy", ent), ("jsd", jsd)):
                want = np.quantile(values.numpy(), aa.QUARTILES, axis=-1).transpose(1, 2, 0)
                assert np.abs(np.array(got[f"{stat}_quartiles"]) - want).max() <= QUANTILE_BOUND + 1e-6
        difference = s["own_scores"]["max_abs_difference_from_used"]
        own_stats = {k: v for k, v in s["own_scores"].items() if k != "max_abs_difference_from_used"}
        used_stats = {k: v for k, v in s.items() if k != "own_scores"}
        if arch == "transformer":  # Post-LN: the control is the measurement
            assert difference == [0.0, 0.0, 0.0]
            assert own_stats == used_stats
        else:  # RealFormer: layer 1 attends with its own scores, layers 2 and 3 with the sum
            assert difference[0] == 0.0 and min(difference[1:]) > 1e-3
            assert own_stats["entropy_median"][0] == used_stats["entropy_median"][0]
            assert own_stats["jsd_median"] != used_stats["jsd_median"]

    summary = aa.layer_summary([analysis])
    for rows in summary.values():
        for row in rows:
            assert set(aa.SUMMARY_KEYS) <= set(row)
            if arch == "transformer":
                assert row["own_entropy_median"] == row["entropy_median"]
                assert row["own_jsd_median"] == row["jsd_median"]
    markdown = aa.summary_markdown([analysis], summary)
    assert "| layer | entropy | own entropy | JSD | own JSD |" in markdown
    assert "Control (own scores)" in markdown and "softmax(mask(S_n))" in markdown
    assert "by construction" in markdown and "is learned" in markdown
    # the line saying the control equals the measurement appears exactly where it does
    assert markdown.count("own = used there") == (3 if arch == "transformer" else 0)


def test_own_scores_isolate_what_the_residual_sum_builds_in(dictionary):
    """Same weights (same seed), Post-LN vs RealFormer: the encoder's layer 1 is the same
    function, so layer 2 gets the same input and its own scores are Post-LN's layer-2
    attention exactly, while the attention RealFormer's layer 2 uses (A_1 + S_2) is not:
    any difference in its entropy or JSD there is construction, nothing learned."""
    src, lengths, tgt = _padded_batch(dictionary)
    got = {}
    for arch in ("transformer", "realformer_transformer"):
        model = build(arch, dictionary=dictionary)
        with aa.recording_attention(model) as record:
            got[arch] = aa.attention_probabilities(
                model, record, {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": tgt},
                own_scores=True)
    (post_used, _), (real_used, real_own) = got["transformer"], got["realformer_transformer"]
    rows = src.ne(dictionary.pad())
    def on_rows(x):
        return x.permute(0, 2, 1, 3)[rows]

    assert (on_rows(real_used["encoder_self"][0]) - on_rows(post_used["encoder_self"][0])).abs().max() < 1e-6
    assert (on_rows(real_own["encoder_self"][1]) - on_rows(post_used["encoder_self"][1])).abs().max() < 1e-6
    assert (on_rows(real_used["encoder_self"][1]) - on_rows(post_used["encoder_self"][1])).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["realformer_transformer", "transformer"])
def test_recording_does_not_change_the_model_output(dictionary, arch):
    model = build(arch, dictionary=dictionary)
    src, lengths, tgt = _padded_batch(dictionary)
    with torch.no_grad():
        plain = model(src, lengths, tgt)[0]
        with aa.recording_attention(model):
            recorded = model(src, lengths, tgt)[0]
        after = model(src, lengths, tgt)[0]
    assert (plain - recorded).abs().max() < 1e-5
    assert torch.equal(plain, after)  # hooks removed
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


ENCODER_ONLY = ["roberta"] + [a for a in ("realformer_bert_small",) if a in ARCH_MODEL_REGISTRY]


@pytest.mark.parametrize("arch", ENCODER_ONLY)
def test_encoder_only_models_have_encoder_self_attention_only(monkeypatch, arch):
    """RoBERTa (and realformer_bert, once registered): chosen by model type; the
    probabilities read equal the paper formula on the encoder."""
    d = make_dictionary()
    d.add_symbol("<mask>")
    args = argparse.Namespace(
        encoder_layers=3, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4,
        dropout=0.0, attention_dropout=0.0, activation_fn="relu", max_positions=32,
    )
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task).eval()
    assert list(aa.attention_modules(model)) == ["encoder_self"]

    src = batch(d)[0]
    src[:, 0] = d.bos()
    src = torch.stack([torch.cat([r[r.ne(d.pad())], r[r.eq(d.pad())]]) for r in src])  # right-padded
    with aa.recording_attention(model) as record:
        got = aa.attention_probabilities(model, record, {"src_tokens": src})["encoder_self"]

    sentence_encoder = model.encoder.sentence_encoder
    params = {k.replace("encoder.sentence_encoder.", "encoder."): v for k, v in model.named_parameters()}
    src_pad = src.eq(d.pad())
    residual = getattr(getattr(sentence_encoder, "residual", None), "paths", frozenset())
    mode = getattr(getattr(sentence_encoder, "residual", None), "mode", "sum")
    assert residual == ({"encoder"} if arch.startswith("realformer") else frozenset())

    def reference():
        x, _ = sentence_encoder.forward_embedding(src)
        x = x * (~src_pad).unsqueeze(-1)
        ref.encoder(params, x, src_pad, 3, 4, set(residual), mode)

    want = _reference_probabilities(monkeypatch, reference)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert (g - w).abs().permute(0, 2, 1, 3)[~src_pad].max() < 1e-5


def test_masked_tokens_are_restored_to_the_original_text():
    """fairseq's own masking (80/10/10), undone from its target."""
    from fairseq.data import ListDataset, MaskTokensDataset, RightPadDataset

    d = make_dictionary()
    mask = d.add_symbol("<mask>")
    g = torch.Generator().manual_seed(3)
    originals = [torch.randint(d.nspecial, mask, (n,), generator=g) for n in (9, 6, 12, 4)]
    data = ListDataset(originals, np.array([len(x) for x in originals]))
    src, tgt = MaskTokensDataset.apply_mask(data, d, pad_idx=d.pad(), mask_idx=mask, seed=1, mask_prob=0.3)
    collate = RightPadDataset(src, pad_idx=d.pad()).collater
    sample = {
        "net_input": {"src_tokens": collate([src[i] for i in range(4)])},
        "target": RightPadDataset(tgt, pad_idx=d.pad()).collater([tgt[i] for i in range(4)]),
    }
    assert sample["net_input"]["src_tokens"].eq(mask).any()
    assert aa.restore_masked_tokens(sample, d.pad())
    want = RightPadDataset(data, pad_idx=d.pad()).collater(originals)
    assert torch.equal(sample["net_input"]["src_tokens"], want)
    assert not aa.restore_masked_tokens({"net_input": {"src_tokens": want}, "target": torch.zeros(4)}, d.pad())


# --------------------------------------------------------------------------- checkpoints and the script

@pytest.fixture(scope="session")
@trains
def trained_vanilla(data_bin, tmp_path_factory):
    """fairseq's own ``transformer``, same tiny recipe as conftest's ``trained``."""
    save = tmp_path_factory.mktemp("vanilla")
    run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "transformer",
        "--max-update", 30, "--save-dir", save, *TINY_FLAGS)
    return save


def _script(*args, check=True):
    """The script as a user runs it, in its own process."""
    proc = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                          env=cli_env(), timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"analyze_attention.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def _exact_values(checkpoint, data_bin, n):
    """Per-token values of the first n test sentences gathered without the histograms,
    one sentence per forward pass: ``{type: (entropy [L, H, N], jsd [L-1, H, N])}``."""
    model, task, _ = aa.load_checkpoint(str(checkpoint), str(data_bin))
    task.load_dataset("test")
    dataset = task.dataset("test")
    pads = {"source": task.source_dictionary.pad(), "target": task.target_dictionary.pad()}
    values = {}
    with aa.recording_attention(model) as record:
        for i in range(n):
            net_input, masks = aa.model_inputs(model, dataset.collater([dataset[i]]), pads)
            probs = aa.attention_probabilities(model, record, net_input)
            for t in probs:
                values.setdefault(t, []).append(aa.token_statistics(probs[t], *masks[t])[:2])
    return {t: tuple(torch.cat(parts, -1).numpy() for parts in zip(*v)) for t, v in values.items()}


@pytest.mark.slow
def test_script_compares_realformer_with_vanilla_transformer(trained, trained_vanilla, data_bin, tmp_path):
    realformer = trained[0] / "checkpoint_last.pt"
    vanilla = trained_vanilla / "checkpoint_last.pt"
    out = tmp_path / "analysis"
    proc = _script("--path", realformer, "--compare", vanilla, "--data", data_bin, "--subset", "test",
                   "--max-sentences", 30, "--batch-size", 8, "--out", out, "--cpu")

    stats = json.loads((out / "attention_stats.json").read_text())
    other = json.loads((out / "attention_stats_compare.json").read_text())
    assert set(stats) == set(other) == {"encoder_self", "decoder_self", "cross", "statistic_sets", "checkpoint",
                                        "sentences"}
    assert stats["checkpoint"] == str(realformer) and other["checkpoint"] == str(vanilla)
    assert stats["sentences"] == other["sentences"] == 30
    for result in (stats, other):
        for t in aa.ATTENTION_TYPES:
            for s in (result[t], result[t]["own_scores"]):  # the attention used and the own-score control
                assert set(s) - {"own_scores", "max_abs_difference_from_used"} == {
                    "entropy_median", "entropy_quartiles", "jsd_median", "jsd_quartiles"}
                ent_q, jsd_q = np.array(s["entropy_quartiles"]), np.array(s["jsd_quartiles"])
                assert np.array(s["entropy_median"]).shape == (2, 2) and ent_q.shape == (2, 2, 3)
                assert np.array(s["jsd_median"]).shape == (1, 2) and jsd_q.shape == (1, 2, 3)
                assert (np.diff(ent_q, axis=-1) >= 0).all() and (np.diff(jsd_q, axis=-1) >= 0).all()
                assert np.array_equal(ent_q[..., 1], s["entropy_median"])
                assert (ent_q >= 0).all() and (ent_q <= math.log(20)).all()  # sentences are < 20 tokens
                assert (jsd_q >= 0).all() and (jsd_q <= LN2).all()
    for t in aa.ATTENTION_TYPES:
        # the vanilla transformer attends with its own scores; RealFormer from layer 2 on with the sum
        assert other[t]["own_scores"]["max_abs_difference_from_used"] == [0.0, 0.0]
        assert {k: v for k, v in other[t]["own_scores"].items() if k != "max_abs_difference_from_used"} == {
            k: v for k, v in other[t].items() if k != "own_scores"}
        difference = stats[t]["own_scores"]["max_abs_difference_from_used"]
        assert difference[0] == 0.0 and difference[1] > 1e-3

    # the streamed medians and quartiles equal the exact ones of every real token (to the
    # histogram's stated bound, plus the 6 decimals of the JSON)
    exact = _exact_values(realformer, data_bin, 30)
    for t in aa.ATTENTION_TYPES:
        for stat, values in zip(aa.STATISTICS, exact[t]):
            want = np.quantile(values, aa.QUARTILES, axis=-1).transpose(1, 2, 0)
            assert np.abs(np.array(stats[t][f"{stat}_quartiles"]) - want).max() <= QUANTILE_BOUND + 1e-6, (t, stat)
    assert exact["encoder_self"][0].shape[-1] == json.loads((out / "run.json").read_text())[
        "models"][0]["tokens"]["encoder_self"]

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(f"{t}_{s}{suffix}.png" for t in aa.ATTENTION_TYPES for s in aa.STATISTICS
                          for suffix in ("", "_own_scores"))
    import matplotlib.image
    for name in pngs:
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05  # something was drawn

    summary = (out / "summary.md").read_text()
    assert "realformer_transformer (Post-LN, residual mean: encoder,decoder,cross)" in summary
    assert "transformer (Post-LN)" in summary
    for t in aa.ATTENTION_TYPES:
        assert f"### {t}" in summary
    assert ("| layer | entropy A | entropy B | own entropy A | own entropy B | JSD A | JSD B | own JSD A | "
            "own JSD B |") in proc.stdout
    assert "Control (own scores)" in summary
    assert summary.count("B: own scores are the attention used in every layer") == 3
    assert "| 2 |" in proc.stdout

    run_info = json.loads((out / "run.json").read_text())
    for model in run_info["models"]:
        assert model["max_probability_on_padding"] == {t: 0.0 for t in aa.ATTENTION_TYPES}

    # re-running (the library function the script calls, same settings) reuses the
    # finished analysis and writes the same numbers
    log = []
    aa.analyze_and_report(str(realformer), str(data_bin), str(out), compare=str(vanilla), subset="test",
                          max_sentences=30, batch_size=8, log=log.append)
    assert sum("already analysed" in m for m in log) == 2
    assert json.loads((out / "attention_stats.json").read_text()) == stats
    assert json.loads((out / "attention_stats_compare.json").read_text()) == other


def test_interrupted_analysis_resumes_to_the_same_result(trained, data_bin, tmp_path, monkeypatch):
    checkpoint = str(trained[0] / "checkpoint_last.pt")
    settings = dict(subset="test", max_sentences=24, batch_size=4, log=lambda m: None)
    whole = aa.analyze_checkpoint(checkpoint, str(data_bin), **settings)

    state = str(tmp_path / "state.npz")
    calls = {"n": 0}
    forward = aa.forward

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        forward(*args, **kwargs)
        if calls["n"] == 3:  # Ctrl-C after every layer of batch 3 was seen, before it was done
            raise KeyboardInterrupt

    monkeypatch.setattr(aa.analysis, "forward", interrupted)  # what analyze_checkpoint calls
    with pytest.raises(KeyboardInterrupt):
        aa.analyze_checkpoint(checkpoint, str(data_bin), state_path=state, **settings)
    monkeypatch.setattr(aa.analysis, "forward", forward)

    log = []
    resumed = aa.analyze_checkpoint(checkpoint, str(data_bin), state_path=state, **{**settings, "log": log.append})
    assert any("resuming at batch 3/" in m for m in log)
    assert resumed.to_json() == whole.to_json()
    for t in whole.types:
        assert np.array_equal(resumed.types[t].entropy.counts, whole.types[t].entropy.counts)
        assert np.array_equal(resumed.types[t].own_jsd.counts, whole.types[t].own_jsd.counts)
        assert np.array_equal(resumed.types[t].own_difference, whole.types[t].own_difference)
        assert resumed.types[t].tokens == whole.types[t].tokens

    # other settings: the saved progress is not reused
    log.clear()
    other = aa.analyze_checkpoint(checkpoint, str(data_bin), state_path=state, **{**settings, "max_sentences": 8,
                                                                                "log": log.append})
    assert other.sentences == 8 and not any("resuming" in m or "already" in m for m in log)


def test_bad_inputs_are_one_clear_sentence(trained, data_bin, tmp_path):
    checkpoint = trained[0] / "checkpoint_last.pt"
    with pytest.raises(CheckpointFileError, match="--path"):
        aa.load_checkpoint(str(tmp_path / "missing.pt"), str(data_bin))
    with pytest.raises(DataError, match="--data"):
        aa.load_checkpoint(str(checkpoint), str(tmp_path / "no-such-dir"))
    # its main in this process (tests/inprocess.py: stdout, stderr and exit status as a subprocess gives them)
    proc = run("realformer-analyze-attention", "--path", checkpoint, "--data", data_bin, "--subset", "nosuchsplit",
               "--out", tmp_path / "o", "--cpu", check=False, argv0=SCRIPT)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("realformer_nmt: error: --subset: no 'nosuchsplit' split")


@pytest.fixture(scope="session")
@trains
def trained_roberta(tmp_path_factory):
    """fairseq's ``roberta`` on a tiny masked-LM corpus (fairseq-preprocess --only-source)."""
    from cli_helpers import write_reversal_corpus

    raw = tmp_path_factory.mktemp("mlm_raw")
    write_reversal_corpus(raw)
    data = tmp_path_factory.mktemp("mlm_bin")
    run("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.src", "--validpref", raw / "valid.src",
        "--testpref", raw / "test.src", "--destdir", data, "--workers", "1")
    save = tmp_path_factory.mktemp("roberta")
    run(
        "fairseq-train", data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", "roberta", "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
        "--encoder-attention-heads", 2, "--max-positions", 32, "--tokens-per-sample", 32,
        "--sample-break-mode", "eos", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 2000, "--cpu",
        "--no-progress-bar", "--max-update", 5, "--save-dir", save, "--no-epoch-checkpoints", "--seed", 1,
    )
    return save / "checkpoint_last.pt", data, raw


@pytest.mark.slow
def test_masked_lm_checkpoint_is_analysed_on_encoder_self_attention(trained_roberta, tmp_path):
    checkpoint, data, raw = trained_roberta
    result = aa.analyze_and_report(str(checkpoint), str(data), str(tmp_path), subset="test", log=lambda m: None)
    stats = json.loads((tmp_path / "attention_stats.json").read_text())
    assert set(stats) == {"encoder_self", "statistic_sets", "checkpoint", "sentences"}
    assert np.array(stats["encoder_self"]["entropy_quartiles"]).shape == (2, 2, 3)
    assert stats["encoder_self"]["own_scores"]["max_abs_difference_from_used"] == [0.0, 0.0]  # fairseq's roberta
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "encoder_self_entropy.png", "encoder_self_entropy_own_scores.png",
        "encoder_self_jsd.png", "encoder_self_jsd_own_scores.png"]
    lines = (raw / "test.src").read_text().splitlines()
    # every token of every sentence (plus <s> and </s>) is one real query
    details = json.loads((tmp_path / "run.json").read_text())["models"][0]
    assert details["tokens"]["encoder_self"] == sum(len(line.split()) + 2 for line in lines)
    assert stats["sentences"] == len(lines)
    assert result["layer_summary"]["encoder_self"][1]["jsd_median"][0] is not None
