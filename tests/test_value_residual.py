"""Value residual (ResFormer, ``--value-residual-paths`` / ``--value-residual-mix``) against the formula
written out below in plain torch, ``V'_n = l1 V_n + l2 V_1`` on each path (encoder self, decoder
self, cross), with and without residual scores, every kernel, padded sources and targets; cached
decoding and beam search equal the full pass; layerdrop (a dropped first layer: ``V_1`` from the
first layer that runs) and the running mean; ``none`` is today's model bit for bit; no extra host
reads; realformer_bert. Flags, checkpoints, the export and the harness: test_value_residual_tools.py."""

import math

import pytest
import torch
import torch.nn.functional as F
from bert_helpers import build_bert
from conftest import batch, build, make_dictionary
from fairseq.modules.layer_drop import LayerDropModuleList
from fairseq.sequence_generator import SequenceGenerator
from test_fidelity_options import keep_fixed_layers
from test_host_syncs import count_training_pass, fairseq_batch
from test_incremental_decoding import step_by_step

from realformer_nmt import residual_config
from realformer_nmt.modules.residual_attention import triton_kernel

ALL = "encoder,decoder,cross"
VALUE_PATHS = ["encoder", "decoder", "cross", ALL]
MIXES = ["half", "learned"]


def kernels():
    """The kernels this machine runs: triton where it runs here (Triton's interpreter on CPU, tests/conftest.py)."""
    runs_triton = triton_kernel.unsupported(torch.device("cpu"), torch.float32, 4) is None
    return ["materialized", "bias"] + (["triton"] if runs_triton else [])


# --------------------------------------------------------------------------------------
# The formula, written out (reads the model's parameters by fairseq's names)
# --------------------------------------------------------------------------------------

def attention(p, xq, xkv, heads, pad, causal, prev, scores, mode, n, first, mix):
    """One attention sub-layer, x: ``[B, L, C]``. ``prev``: the running sum of scores (``scores``: on a
    score path), ``n`` its layers; ``first``: the path's V_1 (None: this layer's values become V_1;
    ``mix`` None: no value residual). Returns ``(out, A_n or None, V_1 or None)``."""
    B, T, C = xq.shape
    S, d = xkv.shape[1], C // heads
    q = F.linear(xq, p["q_proj.weight"], p["q_proj.bias"])
    k = F.linear(xkv, p["k_proj.weight"], p["k_proj.bias"])
    v = F.linear(xkv, p["v_proj.weight"], p["v_proj.bias"])
    if mix is not None and first is None:
        first = v  # the first layer of the path that runs
    elif mix == "half":
        v = 0.5 * v + 0.5 * first
    elif mix == "learned":
        lam = p["value_residual.lamb"]
        v = (1 - lam) * v + lam * first
    q, k, v = (t.view(B, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    a = q @ k.transpose(-1, -2) / math.sqrt(d)
    if scores and prev is not None:
        a = a + prev
    logits = a / n if scores and mode == "mean" else a
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    if causal:
        logits = logits.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, T, C)
    return F.linear(out, p["out_proj.weight"], p["out_proj.bias"]), (a if scores else None), first


def sub(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def block(p, norm, x, fn, pre_ln):
    """Post-LN: LN(x + f(x)); Pre-LN: x + f(LN(x))."""
    def ln(h):
        return F.layer_norm(h, h.shape[-1:], p[norm + ".weight"], p[norm + ".bias"])
    return x + fn(ln(x)) if pre_ln else ln(x + fn(x))


def ffn(p, x, act=F.relu):
    return F.linear(act(F.linear(x, p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"], p["fc2.bias"])


class Path:
    """One path's state through the stack: running sum, its layers, V_1."""

    def __init__(self, name, paths, value_paths, mix):
        self.scores, self.mix = name in paths, (mix if name in value_paths else None)
        self.prev, self.n, self.first = None, 0, None

    def __call__(self, p, xq, xkv, heads, pad, causal, mode):
        self.n += 1
        out, self.prev, self.first = attention(p, xq, xkv, heads, pad, causal, self.prev, self.scores, mode,
                                               self.n, self.first, self.mix)
        return out


def ref_encoder(params, x, pad, kept, heads, paths, value_paths, mix, mode, pre_ln, act=F.relu, prefix="encoder."):
    path = Path("encoder", paths, value_paths, mix)
    for i in kept:
        p = sub(params, f"{prefix}layers.{i}.")
        x = block(p, "self_attn_layer_norm", x, lambda h, p=p: path(sub(p, "self_attn."), h, h, heads, pad, False,
                                                                     mode), pre_ln)
        x = block(p, "final_layer_norm", x, lambda h, p=p: ffn(p, h, act), pre_ln)
    if pre_ln:
        x = F.layer_norm(x, x.shape[-1:], params[prefix + "layer_norm.weight"], params[prefix + "layer_norm.bias"])
    return x


def ref_decoder(params, y, tgt_pad, enc, src_pad, kept, heads, paths, value_paths, mix, mode, pre_ln):
    self_path, cross = Path("decoder", paths, value_paths, mix), Path("cross", paths, value_paths, mix)
    for i in kept:
        p = sub(params, f"decoder.layers.{i}.")
        y = block(p, "self_attn_layer_norm", y,
                  lambda h, p=p: self_path(sub(p, "self_attn."), h, h, heads, tgt_pad, True, mode), pre_ln)
        y = block(p, "encoder_attn_layer_norm", y,
                  lambda h, p=p: cross(sub(p, "encoder_attn."), h, enc, heads, src_pad, False, mode), pre_ln)
        y = block(p, "final_layer_norm", y, lambda h, p=p: ffn(p, h), pre_ln)
    if pre_ln:
        y = F.layer_norm(y, y.shape[-1:], params["decoder.layer_norm.weight"], params["decoder.layer_norm.bias"])
    return y


def reference(model, src, tgt, paths, value_paths, mix, mode="sum", pre_ln=False, enc_kept=None, dec_kept=None):
    """``(encoder states [B, S, C], logits)`` by the formula, with the model's live parameters."""
    params = dict(model.named_parameters())
    paths, value_paths = set(residual_config.parse_paths(paths)), set(residual_config.parse_paths(value_paths))
    enc_m, dec_m = model.encoder, model.decoder
    heads = enc_m.layers[0].self_attn.num_heads
    src_pad, tgt_pad = src.eq(enc_m.padding_idx), tgt.eq(dec_m.padding_idx)
    x = (enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)) * (~src_pad).unsqueeze(-1)
    enc = ref_encoder(params, x, src_pad, enc_kept or range(len(enc_m.layers)), heads, paths, value_paths, mix,
                      mode, pre_ln)
    y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
    feats = ref_decoder(params, y, tgt_pad if tgt_pad.any() else None, enc, src_pad,
                        dec_kept or range(len(dec_m.layers)), heads, paths, value_paths, mix, mode, pre_ln)
    return enc, feats @ dec_m.output_projection.weight.t()


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def value_model(dictionary, value_paths=ALL, mix="learned", seed=0, **overrides):
    """A tiny model with value residual; a learned mix gets a distinct λ per layer and path."""
    model = build(dictionary=dictionary, seed=seed, **{"value_residual_paths": value_paths,
                                                        "value_residual_mix": mix, **overrides})
    g = torch.Generator().manual_seed(seed + 11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("value_residual.lamb"):
                p.copy_(torch.rand((), generator=g) * 1.5 - 0.25)
    return model


def padded_batch(dictionary, bsz=3):
    """Left-padded sources (rows 0 and 1), right-padded targets (row 2), as fairseq batches them."""
    src, lengths, tgt = batch(dictionary, bsz=bsz)
    tgt[2, -2:] = dictionary.pad()
    return src, lengths, tgt


def same_gradients(model, got, want, tol=1e-5):
    """Every parameter's gradient of one loss over ``got`` and over ``want`` agree; returns the names
    of the parameters with a non-zero gradient."""
    named = list(model.named_parameters())
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(7))
    g_got = torch.autograd.grad((got * weights).sum(), [p for _, p in named], allow_unused=True, retain_graph=True)
    g_want = torch.autograd.grad((want * weights).sum(), [p for _, p in named], allow_unused=True)
    reached = []
    for (name, p), a, b in zip(named, g_got, g_want):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        assert (a - b).abs().max() < tol * max(1.0, b.abs().max().item()), name
        if a.abs().max() > 0:
            reached.append(name)
    return reached


# --------------------------------------------------------------------------------------
# the formula
# --------------------------------------------------------------------------------------

# every path alone and all three with the CPU kernels; triton (interpreted here: slow) on all three
FORMULA_CASES = [(paths, kernel) for paths in VALUE_PATHS for kernel in ("materialized", "bias")] + [
    (ALL, kernel) for kernel in kernels()[2:]]


@pytest.mark.parametrize("scores", ["none", ALL])
@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("value_paths, kernel", FORMULA_CASES)
def test_model_matches_the_formula(value_paths, kernel, mix, scores):
    """Outputs and every gradient (the lambdas' included) equal the formula, with or without residual
    scores, on padded sources and targets, in training mode (every layer runs ``kernel``)."""
    d = make_dictionary()
    model = value_model(d, value_paths, mix, residual_attention_paths=scores,
                        residual_attention_kernel=kernel).train()
    src, lengths, tgt = padded_batch(d)
    got_enc = model.encoder(src, lengths)["encoder_out"][0].transpose(0, 1)
    got, _ = model(src, lengths, tgt)
    want_enc, want = reference(model, src, tgt, scores, value_paths, mix)
    real = ~src.eq(d.pad())
    assert (got_enc - want_enc)[real].abs().max() < 1e-5
    assert (got - want).abs().max() < 1e-5 * max(1.0, want.abs().max().item())
    reached = same_gradients(model, got, want)
    lambdas = [n for n, _ in model.named_parameters() if n.endswith("value_residual.lamb")]
    assert len(lambdas) == (0 if mix == "half" else 2 * len(value_paths.split(",")))
    assert set(lambdas) <= set(reached)  # every mix is learned: a gradient for each lambda
    # the formula tests would pass trivially if value residual changed nothing
    plain = reference(model, src, tgt, scores, "none", None)[1]
    assert (got - plain).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pre_ln_and_the_running_mean_match_the_formula(mode):
    """Pre-LN (--encoder-normalize-before --decoder-normalize-before) with residual scores in sum and
    mean mode: the mean still divides by the layers in the score sum, whatever value residual does."""
    d = make_dictionary()
    model = value_model(d, ALL, "learned", residual_attention_paths=ALL, residual_attention_mode=mode,
                        encoder_normalize_before=True, decoder_normalize_before=True, encoder_layers=4).train()
    src, lengths, tgt = padded_batch(d)
    got, _ = model(src, lengths, tgt)
    want = reference(model, src, tgt, ALL, ALL, "learned", mode=mode, pre_ln=True)[1]
    assert (got - want).abs().max() < 1e-5
    same_gradients(model, got, want)


def test_a_learned_mix_starts_as_the_half_mix():
    """λ starts at 0.5: a fresh learned model computes the half mix's outputs bit for bit; the first
    layer of each path has no λ (it never mixes), the others one each."""
    d = make_dictionary()
    half, learned = (build(dictionary=d, value_residual_paths=ALL, value_residual_mix=m) for m in MIXES)
    src, lengths, tgt = padded_batch(d)
    assert torch.equal(learned(src, lengths, tgt)[0], half(src, lengths, tgt)[0])
    names = {n: p.tolist() for n, p in learned.named_parameters() if "value_residual" in n}
    assert names == {f"{stack}.layers.{i}.{attn}.value_residual.lamb": 0.5 for i in (1, 2)
                     for stack, attn in (("encoder", "self_attn"), ("decoder", "self_attn"),
                                         ("decoder", "encoder_attn"))}


def test_none_is_todays_model_bit_for_bit():
    """``--value-residual-paths none`` (and a model built before the flag existed) has today's
    parameters, modules and outputs: no value residual submodule, no hook on ``v_proj``."""
    d = make_dictionary()
    src, lengths, tgt = padded_batch(d)
    for scores in ("none", ALL):
        today = build(dictionary=d, residual_attention_paths=scores)  # args without the new flags
        off = build(dictionary=d, residual_attention_paths=scores, value_residual_paths="none",
                    value_residual_mix="half")
        assert list(today.state_dict()) == list(off.state_dict())
        assert all(torch.equal(a, b) for a, b in zip(today.state_dict().values(), off.state_dict().values()))
        assert not any("value_residual" in n for n, _ in off.named_modules())
        for m in off.modules():
            if hasattr(m, "v_proj"):
                assert m.value_residual is None and not m.v_proj._forward_hooks
        today.train(), off.train()
        a, b = today(src, lengths, tgt)[0], off(src, lengths, tgt)[0]
        assert torch.equal(a, b)
        a.sum().backward(), b.sum().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(today.parameters(), off.parameters()))


# --------------------------------------------------------------------------------------
# cached decoding
# --------------------------------------------------------------------------------------

CACHED = [dict(), dict(residual_attention_paths="none", value_residual_mix="half"),
          dict(residual_attention_kernel="bias", residual_attention_mode="mean"),
          dict(encoder_normalize_before=True, decoder_normalize_before=True, residual_attention_paths="none"),
          dict(cross_self_attention=True), dict(value_residual_paths="decoder"), dict(value_residual_paths="cross")]


@pytest.mark.parametrize("overrides", CACHED, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "all")
def test_cached_decoding_equals_the_full_pass_after_a_beam_reorder(overrides):
    """Two sentences x three beams, reordered mid-sentence (repeats and drops) as beam search does."""
    d = make_dictionary()
    model = value_model(d, **overrides)
    src, lengths, tgt = batch(d, bsz=6)
    beams = torch.tensor([0, 0, 0, 1, 1, 1])
    src, lengths = src[beams], lengths[beams]
    new_order = torch.tensor([1, 1, 0, 5, 3, 3])
    with torch.no_grad():
        incremental, reordered = step_by_step(model, model.encoder(src, lengths), tgt, 3, new_order)
        full, _ = model(src, lengths, reordered)
    assert not torch.equal(reordered, tgt)
    assert (incremental - full).abs().max() < 1e-5


def test_the_cache_holds_the_mixed_values():
    """After cached decoding, each decoder layer's cached values (self and cross) are its mixed values
    of the full pass, ``l1 V_n + l2 V_1`` at every position (the first layer's: its own, unmixed)."""
    d = make_dictionary()
    model = value_model(d, ALL, "learned")
    src, lengths, tgt = batch(d)
    inputs, outputs = {}, {}
    for i, layer in enumerate(model.decoder.layers):
        for kind in ("self_attn", "encoder_attn"):
            v_proj = getattr(layer, kind).v_proj
            v_proj.register_forward_pre_hook(lambda m, a, key=(i, kind): inputs.__setitem__(key, a[0]))
            v_proj.register_forward_hook(lambda m, a, out, key=(i, kind): outputs.__setitem__(key, out))
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        model.decoder(tgt, enc)
        raw = {key: F.linear(x, getattr(model.decoder.layers[key[0]], key[1]).v_proj.weight,
                             getattr(model.decoder.layers[key[0]], key[1]).v_proj.bias) for key, x in inputs.items()}
        full = dict(outputs)
        state = {}
        for t in range(tgt.size(1)):
            model.decoder(tgt[:, : t + 1], enc, incremental_state=state)
    bsz, heads = tgt.size(0), model.decoder.layers[0].self_attn.num_heads
    for (i, kind), values in full.items():
        attn = getattr(model.decoder.layers[i], kind)
        lam = attn.value_residual.lamb
        want = raw[i, kind] if i == 0 else (1 - lam) * raw[i, kind] + lam * raw[0, kind]
        assert (values - want).abs().max() < 1e-6, (i, kind)
        cached = attn._get_input_buffer(state)["prev_value"]
        assert (cached - want.view(want.size(0), bsz, heads, -1).permute(1, 2, 0, 3)).abs().max() < 1e-5, (i, kind)


@pytest.mark.parametrize("overrides", [dict(), dict(residual_attention_paths="none", value_residual_mix="half")])
def test_beam_search_scores_equal_the_full_pass(overrides):
    """fairseq's SequenceGenerator (cached decoding, a shared encoder copy per sentence in cross
    attention, beam reorders every step) scores each hypothesis as a teacher-forced pass does."""
    d = make_dictionary()
    model = value_model(d, **overrides)
    src, lengths, _ = batch(d)
    generator = SequenceGenerator([model], d, beam_size=4, max_len_b=8, min_len=3)
    checked = 0
    with torch.no_grad():
        hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
        for i, beam in enumerate(hypos):
            for h in beam:
                tokens = h["tokens"].unsqueeze(0)
                prev = torch.cat([tokens.new_full((1, 1), d.eos()), tokens[:, :-1]], dim=1)
                logits, _ = model(src[i:i + 1], lengths[i:i + 1], prev)
                want = model.get_normalized_probs((logits, None), log_probs=True).gather(-1, tokens.unsqueeze(-1))
                assert (h["positional_scores"] - want.squeeze()).abs().max() < 1e-4
                checked += 1
    assert checked == 12


# --------------------------------------------------------------------------------------
# layerdrop, pruning, checkpointed layers
# --------------------------------------------------------------------------------------

def pruned(dictionary, model, enc_kept, dec_kept, **overrides):
    """The same weights in a model of the kept layers only (--encoder/--decoder-layers-to-keep renumber
    them so): a first layer's lambdas, unused there, are dropped on loading."""
    small = build(dictionary=dictionary, encoder_layers=len(enc_kept), decoder_layers=len(dec_kept),
                  **overrides).train()
    state = {}
    for name, value in model.state_dict().items():
        for stack, kept in (("encoder", enc_kept), ("decoder", dec_kept)):
            prefix = f"{stack}.layers."
            if name.startswith(prefix):
                index, rest = name[len(prefix):].split(".", 1)
                if int(index) not in kept:
                    break
                name = f"{prefix}{kept.index(int(index))}.{rest}"
        else:
            state[name] = value
    small.load_state_dict(state)
    return small


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("enc_kept, dec_kept", [([1, 2, 3], [1, 2]), ([0, 2, 3], [0, 2])],
                         ids=["first dropped", "middle dropped"])
def test_layerdrop_takes_v1_from_the_first_layer_that_runs(monkeypatch, enc_kept, dec_kept, mode):
    """A dropped first layer has no V_1: the first layer that runs gives it (its lambdas unused that
    step, no gradient), as in x-transformers; the running mean divides by the layers that ran. Equal to
    the formula over the kept layers, and to the pruned model, outputs and every gradient."""
    d = make_dictionary()
    settings = dict(residual_attention_paths=ALL, residual_attention_mode=mode)
    model = value_model(d, ALL, "learned", encoder_layers=4, decoder_layers=3, encoder_layerdrop=0.5,
                        decoder_layerdrop=0.5, **settings).train()
    assert isinstance(model.encoder.layers, LayerDropModuleList)
    keep_fixed_layers(monkeypatch, {4: enc_kept, 3: dec_kept})
    src, lengths, tgt = padded_batch(d)
    small = pruned(d, model, enc_kept, dec_kept, value_residual_paths=ALL, **settings)
    dropped, _ = model(src, lengths, tgt)
    want = reference(model, src, tgt, ALL, ALL, "learned", mode, enc_kept=enc_kept, dec_kept=dec_kept)[1]
    with torch.no_grad():
        assert (dropped - small(src, lengths, tgt)[0]).abs().max() < 1e-5
    assert (dropped - want).abs().max() < 1e-5
    reached = set(same_gradients(model, dropped, want))
    idle = {("encoder", i) for i in range(4) if i not in enc_kept[1:]} | {
        ("decoder", i) for i in range(3) if i not in dec_kept[1:]}  # dropped, or first of those that ran
    lambdas = {n for n, _ in model.named_parameters() if n.endswith("value_residual.lamb")}
    assert lambdas - reached == {n for n in lambdas if (n.split(".")[0], int(n.split(".")[2])) in idle}
    assert f"encoder.layers.{enc_kept[1]}.self_attn.value_residual.lamb" in reached


def test_checkpointed_layers_keep_every_gradient():
    """--checkpoint-activations replays a layer with the V_1 it was given: the same gradients."""
    d = make_dictionary()
    src, lengths, tgt = padded_batch(d)
    grads = []
    for checkpointed in (False, True):
        model = value_model(d, ALL, "learned", checkpoint_activations=checkpointed).train()
        model(src, lengths, tgt)[0].pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert (g - grads[1][name]).abs().max() < 1e-6, name


# --------------------------------------------------------------------------------------
# host reads
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("scores", ["none", ALL])
@pytest.mark.parametrize("kernel", ["materialized", "bias"])  # auto runs materialized on CPU
def test_host_reads_do_not_grow(kernel, scores):
    """One training forward + backward on fairseq's collated batch (tests/test_host_syncs.py's counter):
    value residual adds no host read to the same model without it, at 2+2 and 4+4 layers."""
    d = make_dictionary(30)
    batch_ = fairseq_batch(d)
    counts = {}
    for layers in (2, 4):
        for paths in ("none", ALL):
            m = build(dictionary=d, encoder_layers=layers, decoder_layers=layers, residual_attention_kernel=kernel,
                      residual_attention_paths=scores, value_residual_paths=paths).train()
            counts[layers, paths] = count_training_pass(m, batch_).total
    assert counts[2, ALL] == counts[2, "none"] == counts[4, ALL], counts
    assert counts[4, "none"] == counts[2, "none"] or scores == "none", counts  # fairseq's own reads per layer


# --------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mix", MIXES)
def test_bert_encoder_matches_the_formula_and_its_heads_train_the_lambdas(mix):
    """realformer_bert (RoBERTa's embeddings, GELU, Post-LN) with value residual on its one path: the
    features equal the formula on padded rows; the LM head and a classification head reach the lambdas."""
    model = build_bert(value_residual_paths="encoder", value_residual_mix=mix).train()
    d = model.encoder.dictionary
    se = model.encoder.sentence_encoder
    g = torch.Generator().manual_seed(3)
    src = torch.randint(d.nspecial, len(d), (3, 9), generator=g)
    src[0, -3:], src[:, 0] = d.pad(), d.bos()
    features = model(src, features_only=True)[0]
    x = se.forward_embedding(src)[0] * (~src.eq(d.pad())).unsqueeze(-1)
    want = ref_encoder(dict(model.named_parameters()), x, src.eq(d.pad()), range(len(se.layers)),
                       se.layers[0].self_attn.num_heads, {"encoder"}, {"encoder"}, mix, "sum", False, F.gelu,
                       prefix="encoder.sentence_encoder.")
    real = ~src.eq(d.pad())
    assert (features - want)[real].abs().max() < 1e-5
    model.register_classification_head("probe", num_classes=2)
    logits = model(src)[0]
    classes = model(src, features_only=True, classification_head_name="probe")[0]
    (logits.logsumexp(-1).mean() + classes.logsumexp(-1).mean()).backward()
    lambdas = [p for n, p in model.named_parameters() if n.endswith("value_residual.lamb")]
    assert len(lambdas) == (2 if mix == "learned" else 0)
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in lambdas)
