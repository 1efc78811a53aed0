"""fairseq options that change which layers or keys attention sees: layerdrop and
pruned models compute the paper's running mean, --cross-self-attention threads the
decoder path, and TorchScript fails with one clear sentence."""

import paper_reference as ref
import pytest
import torch
from cli_helpers import TINY_FLAGS
from conftest import USER_DIR, batch, build
from fairseq.modules.layer_drop import LayerDropModuleList
from inprocess import run_in_process as run  # fairseq's tools in this process (tests/inprocess.py)
from test_incremental_decoding import step_by_step

from realformer_nmt.errors import ConfigError
from realformer_nmt.modules import ResidualMultiheadAttention, ResidualState

KERNELS = ["materialized", "bias"]
LAYERS = dict(encoder_layers=4, decoder_layers=3)
ENC_KEPT, DEC_KEPT = [0, 2, 3], [1, 2]


def keep_fixed_layers(monkeypatch, kept_by_length):
    """Layerdrop in training, but with a fixed kept set per stack (by stack length)."""
    def fixed_iter(self):
        modules = list(torch.nn.ModuleList.__iter__(self))
        kept = kept_by_length[len(modules)] if self.training else range(len(modules))
        return iter([modules[i] for i in kept])

    monkeypatch.setattr(LayerDropModuleList, "__iter__", fixed_iter)


def pruned_copy(dictionary, model, **overrides):
    """The same weights in a model that has only the kept layers (what
    --encoder-layers-to-keep / --decoder-layers-to-keep load)."""
    small = build(dictionary=dictionary, encoder_layers=len(ENC_KEPT), decoder_layers=len(DEC_KEPT),
                  **overrides).train()
    state = {}
    for name, value in model.state_dict().items():
        for stack, kept in (("encoder", ENC_KEPT), ("decoder", DEC_KEPT)):
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


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("paths", ["encoder", "decoder", "cross"])
def test_layerdrop_with_fixed_kept_set_equals_pruned_model(dictionary, monkeypatch, paths, mode, kernel):
    """Layers {1,3,4} of 4 kept: layer 4 divides a 3-term sum by 3, exactly as the
    3-layer pruned model and the paper's formula over the kept layers do."""
    settings = dict(residual_attention_paths=paths, residual_attention_mode=mode,
                    residual_attention_kernel=kernel)
    model = build(dictionary=dictionary, encoder_layerdrop=0.5, decoder_layerdrop=0.5, **LAYERS,
                  **settings).train()
    assert isinstance(model.encoder.layers, LayerDropModuleList)
    keep_fixed_layers(monkeypatch, {4: ENC_KEPT, 3: DEC_KEPT})
    src, lengths, tgt = batch(dictionary)
    pruned = pruned_copy(dictionary, model, **settings)
    with torch.no_grad():
        small, _ = pruned(src, lengths, tgt)
    dropped, _ = model(src, lengths, tgt)
    params = dict(model.named_parameters())
    enc_m, dec_m = model.encoder, model.decoder
    src_pad = src.eq(enc_m.padding_idx)
    x = (enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)) * (~src_pad).unsqueeze(-1)
    heads, want_paths = enc_m.layers[0].self_attn.num_heads, {paths}
    enc = ref.encoder(params, x, src_pad, 4, heads, want_paths, mode, kept=ENC_KEPT)
    y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
    feats = ref.decoder(params, y, enc, src_pad, 3, heads, want_paths, mode, kept=DEC_KEPT)
    want = feats @ dec_m.output_projection.weight.t()
    assert (dropped - small).abs().max() < 1e-5
    assert (dropped - want).abs().max() < 1e-5
    assert_same_gradients(model, dropped, want)


def assert_same_gradients(model, got, want, tol=1e-5):
    """Every parameter's gradient of one loss over ``got`` (the model) and over ``want``
    (the formula written out with the same parameters) agree; an unreached parameter
    counts as a zero gradient. At least one gradient is non-zero."""
    params = [p for _, p in model.named_parameters()]
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(7))
    g_got = torch.autograd.grad((got * weights).sum(), params, allow_unused=True, retain_graph=True)
    g_want = torch.autograd.grad((want * weights).sum(), params, allow_unused=True)
    nonzero = 0
    for (name, p), a, b in zip(model.named_parameters(), g_got, g_want):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        assert (a - b).abs().max() < tol, name
        nonzero += int(a.abs().max() > 0)
    assert nonzero > 0


def test_layerdrop_mean_divides_by_the_layers_that_ran(dictionary, monkeypatch):
    """The bug this guards against: dividing by the static layer position instead
    (layer 4 dividing a 3-term sum by 4) gives a visibly different model."""
    model = build(dictionary=dictionary, encoder_layerdrop=0.5, decoder_layerdrop=0.5, **LAYERS,
                  residual_attention_mode="mean").train()
    keep_fixed_layers(monkeypatch, {4: ENC_KEPT, 3: DEC_KEPT})
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        got, _ = model(src, lengths, tgt)
        full_positions = reference_with_static_divisors(model, src, tgt)
    assert (got - full_positions).abs().max() > 1e-3


def reference_with_static_divisors(model, src, tgt):
    """The wrong rule, written out: the kept layers divide by their position in the full stack."""
    original = ref.attention

    def static(p, x_q, x_kv, heads, prev, key_pad, causal, residual, mode, n, causal_offset=0):
        kept = ENC_KEPT if x_q.shape[1] == src.shape[1] and not causal else DEC_KEPT
        return original(p, x_q, x_kv, heads, prev, key_pad, causal, residual, mode, kept[n - 1] + 1,
                        causal_offset)

    ref.attention = static
    try:
        params = dict(model.named_parameters())
        enc_m, dec_m = model.encoder, model.decoder
        src_pad = src.eq(enc_m.padding_idx)
        x = (enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)) * (~src_pad).unsqueeze(-1)
        paths = {"encoder", "decoder", "cross"}
        heads = enc_m.layers[0].self_attn.num_heads
        enc = ref.encoder(params, x, src_pad, 4, heads, paths, "mean", kept=ENC_KEPT)
        y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
        feats = ref.decoder(params, y, enc, src_pad, 3, heads, paths, "mean", kept=DEC_KEPT)
        return feats @ dec_m.output_projection.weight.t()
    finally:
        ref.attention = original


# --------------------------------------------------------------------------------------
# --cross-self-attention
# --------------------------------------------------------------------------------------

def cross_self_reference(model, src, tgt, mode):
    params = dict(model.named_parameters())
    enc_m, dec_m = model.encoder, model.decoder
    src_pad = src.eq(enc_m.padding_idx)
    x = (enc_m.embed_scale * enc_m.embed_tokens(src) + enc_m.embed_positions(src)) * (~src_pad).unsqueeze(-1)
    heads = enc_m.layers[0].self_attn.num_heads
    paths = {"encoder", "decoder", "cross"}
    enc = ref.encoder(params, x, src_pad, len(enc_m.layers), heads, paths, mode)
    y = dec_m.embed_scale * dec_m.embed_tokens(tgt) + dec_m.embed_positions(tgt)
    feats = ref.decoder(params, y, enc, src_pad, len(dec_m.layers), heads, paths, mode, cross_self=True)
    return feats @ dec_m.output_projection.weight.t()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_cross_self_attention_matches_paper_formula(dictionary, mode, kernel):
    """Self-attention keys [encoder states; target prefix]: one key set at every layer,
    so the decoder path's scores are summed exactly as elsewhere."""
    model = build(dictionary=dictionary, cross_self_attention=True, residual_attention_mode=mode,
                  residual_attention_kernel=kernel).train()
    src, lengths, tgt = batch(dictionary)
    got, _ = model(src, lengths, tgt)
    want = cross_self_reference(model, src, tgt, mode)
    with torch.no_grad():
        plain, _ = build(dictionary=dictionary, residual_attention_mode=mode).train()(src, lengths, tgt)
    assert (got - want).abs().max() < 1e-5
    assert (got - plain).abs().max() > 1e-3  # the option really changes the keys
    assert_same_gradients(model, got, want)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_cross_self_attention_incremental_matches_full_pass(dictionary, mode):
    model = build(dictionary=dictionary, cross_self_attention=True, residual_attention_mode=mode)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        full, _ = model(src, lengths, tgt)
        incremental, _ = step_by_step(model, model.encoder(src, lengths), tgt)
    assert (incremental - full).abs().max() < 1e-5


def test_cross_self_attention_paths_none_equals_fairseq(dictionary):
    ours = build(dictionary=dictionary, cross_self_attention=True, residual_attention_paths="none")
    theirs = build("transformer", dictionary=dictionary, cross_self_attention=True, seed=1)
    theirs.load_state_dict(ours.state_dict())
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        a, _ = ours(src, lengths, tgt)
        b, _ = theirs(src, lengths, tgt)
        inc_a, _ = step_by_step(ours, ours.encoder(src, lengths), tgt)
        inc_b, _ = step_by_step(theirs, theirs.encoder(src, lengths), tgt)
    assert (a - b).abs().max() < 1e-5
    assert (inc_a - inc_b).abs().max() < 1e-5


@pytest.mark.slow
def test_cross_self_attention_trains_and_generates_through_the_cli(data_bin, tmp_path):
    save = tmp_path / "ckpt"
    run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--cross-self-attention", "--max-update", 6, "--save-dir", save, *TINY_FLAGS)
    proc = run("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
               "--cpu", "--beam", 3, "--batch-size", 16, "--scoring", "sacrebleu")
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 40


# --------------------------------------------------------------------------------------
# TorchScript
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("paths", ["encoder,decoder,cross", "none"])
def test_torchscript_fails_at_once_with_one_clear_sentence(dictionary, paths):
    model = build(dictionary=dictionary, residual_attention_paths=paths)
    with pytest.raises(ConfigError,
                       match=r"torch\.jit\.script does not support realformer_transformer.*torch\.compile"):
        torch.jit.script(model)


def test_fairseq_transformer_still_scripts(dictionary):
    """The advice in that sentence holds: a paths-none checkpoint loads into fairseq's
    transformer, which scripts."""
    ours = build(dictionary=dictionary, residual_attention_paths="none")
    theirs = build("transformer", dictionary=dictionary)
    theirs.load_state_dict(ours.state_dict())
    scripted = torch.jit.script(theirs)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        assert (scripted(src, lengths, tgt)[0] - ours(src, lengths, tgt)[0]).abs().max() < 1e-5


# --------------------------------------------------------------------------------------
# --checkpoint-activations
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_checkpoint_activations_keeps_gradients_through_the_residual_paths(dictionary, monkeypatch, mode, kernel):
    """Checkpointed layers replay their forward in backward; the residual state crosses
    layer boundaries with its gradient (the loss, and every parameter's gradient, equal
    those of the plain model)."""
    def gradients(checkpointed):
        model = build(dictionary=dictionary, residual_attention_mode=mode, residual_attention_kernel=kernel,
                      checkpoint_activations=checkpointed, dropout=0.1, seed=3).train()
        src, lengths, tgt = batch(dictionary)
        torch.manual_seed(7)
        logits, _ = model(src, lengths, tgt)
        logits.pow(2).mean().backward()
        return {n: p.grad for n, p in model.named_parameters()}

    plain, ckpt = gradients(False), gradients(True)
    assert set(plain) == set(ckpt)
    for name in plain:
        assert (plain[name] - ckpt[name]).abs().max() < 1e-5, name
    # Both would agree if the residual state reached the next layer cut off from the graph
    # in both: the same run with the state detached between layers (same forward values)
    # must give other gradients, for each path's first-layer query projection, whose
    # contribution through later layers' scores flows only along the residual path.
    with monkeypatch.context() as patch:
        patch.setattr(ResidualMultiheadAttention, "forward", _detaching_prev_state(ResidualMultiheadAttention.forward))
        cut = gradients(False)
    for name in ("encoder.layers.0.self_attn.q_proj.weight", "decoder.layers.0.self_attn.q_proj.weight",
                 "decoder.layers.0.encoder_attn.q_proj.weight"):
        assert (plain[name] - cut[name]).abs().max() > 0.1 * plain[name].abs().max(), name


def _detaching_prev_state(forward):
    """``ResidualMultiheadAttention.forward`` given the previous layer's state detached: a cut residual path."""
    def cut_forward(self, *args, residual_path=None, **kwargs):
        prev_state = residual_path.state if residual_path is not None else None
        if prev_state is not None:
            residual_path.state = ResidualState(
                scores=None if prev_state.scores is None else prev_state.scores.detach(),
                queries=tuple(q.detach() for q in prev_state.queries),
                keys=tuple(k.detach() for k in prev_state.keys), terms=prev_state.terms)
        return forward(self, *args, residual_path=residual_path, **kwargs)
    return cut_forward


@pytest.mark.slow
def test_checkpoint_activations_trains_through_the_cli(data_bin, tmp_path):
    run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--checkpoint-activations", "--max-update", 4, "--save-dir", tmp_path, *TINY_FLAGS)
    assert (tmp_path / "checkpoint_last.pt").exists()
