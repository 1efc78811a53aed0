"""Every residual-attention kernel computes the materialized kernel's function: values,
running sums and gradients of a loss over *all* query rows (padded ones included), on
stacks of attention modules with every kind of mask; the ``bias`` kernel's own contract
(SDPA with ``A_{n-1} / c_n + mask``, ``A_n`` formed only when asked); its accuracy in bf16
at depth; and which kernel each layer of a decoder runs in eval mode.

(The paper formula, cached decoding and layerdrop are checked for every kernel in
test_paper_formula.py, test_incremental_decoding.py and test_fidelity_options.py.)
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import attend, batch, build, make_dictionary

from realformer_nmt.modules import ResidualMultiheadAttention
from realformer_nmt.modules import residual_attention as ra

B, H, T, C = 3, 4, 6, 16
OTHER_KERNELS = ["bias", "auto"]


def stack(kernel, mode, layers=4, seed=0, dtype=torch.float32, embed=C, heads=H):
    torch.manual_seed(seed)
    mods = [ResidualMultiheadAttention(embed, heads, self_attention=True, residual=True, mode=mode, kernel=kernel)
            for _ in range(layers)]
    with torch.no_grad():  # peaked attention, so that the residual scores matter
        for m in mods:
            m.q_proj.weight.mul_(3.0)
            m.k_proj.weight.mul_(3.0)
    return [m.to(dtype) for m in mods]


def run(mods, x, **kw):
    state, outs = None, []
    for m in mods:
        x, _, state = attend(m, x, x, x, prev_state=state, need_weights=False, **kw)
        outs.append(x)
    return torch.stack(outs), state


def masks(kind):
    pad = attn_mask = None
    if kind in ("padding", "causal+right", "causal+left", "fully-padded-row"):
        pad = torch.zeros(B, T, dtype=torch.bool)
    if kind == "padding":
        pad[0, :2] = True
        pad[1, -1] = True
    if kind == "fully-padded-row":
        pad[1] = True
    if kind == "causal+right":
        pad[0, -2:] = True
        pad[2, -1] = True
    if kind == "causal+left":  # the first rows of sentence 0 and 2 see only padding
        pad[0, :3] = True
        pad[2, :1] = True
    if kind.startswith("causal"):
        attn_mask = torch.full((T, T), float("-inf")).triu(1)
    return pad, attn_mask


def forward_backward(kernel, mode, pad, attn_mask, x):
    mods = stack(kernel, mode)
    xin = x.clone().requires_grad_(True)
    outs, state = run(mods, xin, key_padding_mask=pad, attn_mask=attn_mask)
    # a loss over every row, padded queries included (fairseq's criteria read only real rows),
    # except the rows of a sentence that is all padding: fairseq's batches never hold one,
    # and the kernels do not spend a device sync per layer to look for it (forward only)
    weights = torch.linspace(0.5, 1.5, outs.numel()).view_as(outs)
    if pad is not None and attn_mask is None:
        weights = weights * (~pad.all(-1)).float()[None, None, :, None]
    (outs * weights).sum().backward()
    return outs.detach(), state.running_sum().detach(), xin.grad, [p.grad for m in mods for p in m.parameters()]


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "causal+right", "causal+left", "fully-padded-row"])
@pytest.mark.parametrize("kernel", OTHER_KERNELS)
def test_kernel_equals_materialized_on_every_row(kernel, mode, kind):
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(1))
    pad, attn_mask = masks(kind)
    ref = forward_backward("materialized", mode, pad, attn_mask, x)
    got = forward_backward(kernel, mode, pad, attn_mask, x)
    assert torch.isfinite(ref[0]).all() and torch.isfinite(ref[2]).all()
    assert relative_error(got[0], ref[0]) < 1e-5, "outputs"
    assert relative_error(got[1], ref[1]) < 1e-5, "running sums"
    assert relative_error(got[2], ref[2]) < 1e-5, "input gradients"
    # over all parameters at once: some (the key bias) have a gradient that is 0 up to rounding
    worst = relative_error(torch.cat([g.flatten() for g in got[3]]), torch.cat([g.flatten() for g in ref[3]]))
    assert worst < 1e-5, f"parameter gradients differ by {worst:.2e} of their scale"


def relative_error(a, b):
    """max |a - b| over the scale of b (float32 rounding over a 4-layer chain is ~1e-6)."""
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-3)).item()


def test_left_padding_rows_that_see_no_real_key_exist_and_get_no_score_gradient():
    """The case the test above guards: SDPA alone would send these rows a gradient
    (up to ~1e2 before the fix); every kernel now sends them none through the scores."""
    pad, attn_mask = masks("causal+left")
    dead = ra.MaskFacts.of(pad, attn_mask).dead_rows
    assert dead is not None and dead[:, 0, :, 0].tolist() == [
        [True, True, True, False, False, False], [False] * T, [True] + [False] * (T - 1)]
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(2))
    for kernel in ("materialized", "bias"):
        mods = stack(kernel, "sum", layers=2)
        q = mods[1].q_proj.weight
        outs, _ = run(mods, x, key_padding_mask=pad, attn_mask=attn_mask)
        only_dead = torch.zeros_like(outs[1])
        only_dead[:3, 0] = 1.0  # the dead rows of sentence 0, last layer
        (outs[1] * only_dead).sum().backward()
        assert q.grad.abs().max() == 0, kernel  # no gradient through the scores of those rows
        assert mods[1].v_proj.weight.grad.abs().max() > 0, kernel  # the uniform average of values has one


def test_bias_kernel_feeds_sdpa_the_previous_sum_and_forms_a_n_lazily(monkeypatch):
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(3))
    pad, attn_mask = masks("causal+right")
    calls = []
    real_sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        calls.append((attn_mask, kw.get("scale")))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    mods = stack("bias", "mean", layers=3)
    ref = stack("materialized", "mean", layers=3)
    with torch.no_grad():
        state = ref_state = None
        for n, (m, r) in enumerate(zip(mods, ref), start=1):
            calls.clear()
            _, _, new_state = attend(m, x, x, x, prev_state=state, key_padding_mask=pad, attn_mask=attn_mask,
                                need_weights=False)
            _, _, new_ref = attend(r, x, x, x, prev_state=ref_state, key_padding_mask=pad, attn_mask=attn_mask,
                              need_weights=False)
            if n > 1:
                (bias, scale), = calls  # one SDPA call, its mask = A_{n-1} / n + mask
                want = (ref_state.scores / n + attn_mask).masked_fill(pad[:, None, None, :], torch.finfo().min)
                assert bias.shape == (B, H, T, T) and scale == pytest.approx(1 / n)
                assert torch.equal(torch.isneginf(bias), torch.isneginf(want))
                finite = torch.isfinite(want)
                assert (bias[finite] - want[finite]).abs().max() < 1e-5
                # A_n is not multiplied out yet: the state holds A_{n-1} and this layer's q, k
                assert (new_state.scores - ref_state.scores).abs().max() < 1e-5 and len(new_state.queries) == 1
            assert (new_state.running_sum() - new_ref.scores).abs().max() < 1e-4
            assert new_state.terms == new_ref.terms == n
            state, ref_state = new_state, new_ref


@pytest.mark.parametrize("layers", [6, 24])
def test_bias_kernel_in_bf16_is_as_close_to_float32_as_materialized(layers):
    """bf16 weights and activations, float32 running sum: measured distance to the float32
    reference of the same weights. Stated tolerance: outputs within 5% of their scale
    (max abs error / max abs value), and no worse than 1.5x the materialized kernel in bf16
    (measured here: 0.5-0.8% for both kernels at 6 and 24 layers)."""
    x = torch.randn(16, 2, 64, generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, -5:] = True
    causal = torch.full((16, 16), float("-inf")).triu(1)
    errors = {}
    with torch.no_grad():
        reference, _ = run(stack("materialized", "mean", layers, embed=64, heads=4), x,
                           key_padding_mask=pad, attn_mask=causal)
        reference = reference[-1]  # the last layer: errors of every layer below are in it
        scale = reference.abs().max()
        for kernel in ("materialized", "bias"):
            out, state = run(stack(kernel, "mean", layers, embed=64, heads=4, dtype=torch.bfloat16),
                             x.bfloat16(), key_padding_mask=pad, attn_mask=causal)
            assert state.running_sum().dtype == torch.float32
            errors[kernel] = ((out[-1].float() - reference).abs().max() / scale).item()
    print(f"\nbf16 vs float32, {layers} layers, relative max error: {errors}")
    assert errors["bias"] < 0.05
    assert errors["bias"] <= 1.5 * errors["materialized"] + 1e-3


def test_running_sum_keeps_no_float32_copy_of_queries_and_keys():
    """``A_n = A_{n-1} + q k^T`` after a bias layer (``ScoresInFloat32``): the float32 product
    of upcast bf16 queries and keys, forward and gradients as autograd of that product
    computes them, while autograd keeps q and k in bf16 only (the product of float32 copies
    kept both copies, per layer, until backward)."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(T, B, H, 8, generator=g).bfloat16().permute(1, 2, 0, 3).requires_grad_(True)
    k = torch.randn(T, B, H, 8, generator=g).bfloat16().permute(1, 2, 0, 3).requires_grad_(True)
    prev = torch.randn(B, H, T, T, generator=g).requires_grad_(True)
    weights = torch.randn(B, H, T, T, generator=g)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        got = ra.ResidualState(scores=prev, queries=(q,), keys=(k,), terms=2).running_sum()
    assert got.dtype == torch.float32 and saved == [torch.bfloat16, torch.bfloat16]
    (got * weights).sum().backward()
    got_grads = [t.grad.clone() for t in (q, k, prev)]
    for t in (q, k, prev):
        t.grad = None
    want = torch.baddbmm(prev.reshape(B * H, T, T), q.float().reshape(B * H, T, 8),
                         k.float().reshape(B * H, T, 8).transpose(1, 2)).view(B, H, T, T)
    (want * weights).sum().backward()
    assert torch.equal(got, want)
    for mine, theirs in zip(got_grads, [q.grad, k.grad, prev.grad]):
        assert mine.dtype == theirs.dtype and (mine.float() - theirs.float()).abs().max() <= 1e-6 * theirs.abs().max()


@pytest.mark.parametrize("kind", ["causal+right", "padding", "none"])
def test_bias_mask_in_half_precision_is_the_float32_mask_cast(kind):
    """Sum mode, bf16: the bias is the cast of A_{n-1} masked in place, with the values of
    masking in float32 and casting (no float32 T x S temporary)."""
    pad, attn_mask = masks(kind)
    prev = torch.randn(B, H, T, T, generator=torch.Generator().manual_seed(7)) * 300
    facts = ra.MaskFacts.of(pad, attn_mask)
    got = ra.bias._additive_bias(prev, 1.0, pad, attn_mask, torch.bfloat16, facts.future)
    want = prev if attn_mask is None else prev + attn_mask
    if pad is not None:
        want = want.masked_fill(pad[:, None, None, :], torch.finfo(torch.bfloat16).min)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert facts.future == (attn_mask is not None)


# --------------------------------------------------------------------------------------
# Which kernel each layer runs in a whole model
# --------------------------------------------------------------------------------------

def record_kernels(monkeypatch):
    ran = []
    for kernel in ("materialized", "bias"):
        original = getattr(ResidualMultiheadAttention, f"_{kernel}_forward")

        def wrapper(self, *args, _original=original, _kernel=kernel, **kwargs):
            ran.append((self, _kernel))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ResidualMultiheadAttention, f"_{kernel}_forward", wrapper)
    return ran


@pytest.mark.parametrize("kernel,alignment_layer,expected", [
    ("bias", None, ["bias", "bias", "materialized"]),
    # after the alignment layer the sum is multiplied out: bias goes on
    ("bias", 0, ["materialized", "bias", "bias"]),
])
def test_eval_cross_attention_runs_the_chosen_kernel_except_on_the_alignment_layer(
        monkeypatch, kernel, alignment_layer, expected):
    d = make_dictionary()
    model = build(dictionary=d, residual_attention_kernel=kernel, decoder_layers=3)
    model.eval()
    assert all(layer.need_attn for layer in model.decoder.layers)  # fairseq's eval default
    src, lengths, tgt = batch(d)
    encoder_out = model.encoder(src, lengths)
    ran = record_kernels(monkeypatch)
    with torch.no_grad():
        _, extra = model.decoder(tgt, encoder_out=encoder_out, alignment_layer=alignment_layer)
    first = {}  # the outer call of each module
    for module, name in ran:
        first.setdefault(module, name)
    cross = [first[layer.encoder_attn] for layer in model.decoder.layers]
    assert cross == expected
    # the alignment layer's probabilities come back, as fairseq returns them
    assert extra["attn"][0] is not None and extra["attn"][0].shape == (3, tgt.size(1), src.size(1))
    reference = build(dictionary=d, residual_attention_kernel="materialized", decoder_layers=3).eval()
    with torch.no_grad():
        _, want = reference.decoder(tgt, encoder_out=encoder_out, alignment_layer=alignment_layer)
    assert (extra["attn"][0] - want["attn"][0]).abs().max() < 1e-6


# --------------------------------------------------------------------------------------
# The CUDA rule of `auto` (decided without a GPU: the rule is a pure function of the file)
# --------------------------------------------------------------------------------------

CUDA = torch.device("cuda")


@pytest.fixture
def packaged_text(monkeypatch):
    """Replace what the packaged kernel_rule.json holds: set ``text[0]`` (None: no file)."""
    text = [None]

    def read():
        if text[0] is None:
            raise FileNotFoundError("kernel_rule.json")
        return text[0]

    monkeypatch.setattr(ra.choice, "_packaged_rule_text", read)
    # the rule is what auto runs unless triton is preferred and applies (test_triton_kernel.py)
    monkeypatch.setattr(ra.triton_kernel, "unsupported", lambda *args, **kwargs: "not the subject here")
    ra.choice._read_packaged_rule.cache_clear()
    yield text
    ra.choice._read_packaged_rule.cache_clear()


def test_cuda_auto_reads_the_measured_rule_and_logs_it_once(packaged_text, monkeypatch, caplog):
    import json
    import logging

    packaged_text[0] = json.dumps({"device": "NVIDIA H100",
                                   "rule": {"first_layer": "materialized", "later_layers": "bias"}})
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: True)
    notes = ra.KernelNotes()  # what one model's modules share: the rule is said once per model
    with caplog.at_level(logging.INFO, logger=ra.__name__):
        kernels = [ra.auto_kernel(device=CUDA, training_dropout=True, terms=n, notes=notes) for n in (1, 2, 3)]
    assert kernels == ["materialized", "bias", "bias"]
    applied = [r.getMessage() for r in caplog.records if "kernel 'auto' on CUDA" in r.getMessage()]
    assert len(applied) == 1 and "first layer of a path materialized, later layers bias" in applied[0]
    assert "NVIDIA H100" in applied[0]
    # the CPU rule does not change
    assert [ra.auto_kernel(device=torch.device("cpu"), training_dropout=False, terms=n) for n in (1, 2)] == \
        ["materialized", "materialized"]


def test_cuda_auto_without_a_measured_rule_uses_bias_where_a_fused_backend_takes_it(packaged_text, monkeypatch):
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: True)
    assert [ra.auto_kernel(device=CUDA, training_dropout=False, terms=n) for n in (1, 2)] == ["bias", "bias"]
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: False)
    assert [ra.auto_kernel(device=CUDA, training_dropout=False, terms=n) for n in (1, 2)] == \
        ["materialized", "materialized"]
    packaged_text[0] = "{not json"
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: True)
    ra.choice._read_packaged_rule.cache_clear()
    assert ra.auto_kernel(device=CUDA, training_dropout=False, terms=2) == "bias"  # unreadable: the default


def test_cuda_auto_rule_comes_from_the_package_not_the_environment(packaged_text, monkeypatch, tmp_path):
    """Issues 48 and 51: no environment variable, user cache or checkout folder changes
    what auto runs."""
    import json

    packaged_text[0] = json.dumps({"device": "GPU A", "rule": {"first_layer": "materialized",
                                                               "later_layers": "materialized"}})
    other = tmp_path / "kernel_rule.json"
    other.write_text(json.dumps({"device": "GPU B", "rule": {"first_layer": "bias", "later_layers": "bias"}}))
    (tmp_path / "realformer_nmt").mkdir()
    (tmp_path / "realformer_nmt" / "kernel_rule.json").write_text(other.read_text())
    monkeypatch.setenv("REALFORMER_KERNEL_RULE", str(other))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ra.sdpa_probe, "bias_has_fused_backend", lambda device: True)
    assert [ra.auto_kernel(device=CUDA, training_dropout=False, terms=n) for n in (1, 2)] == \
        ["materialized", "materialized"]
    assert ra.kernel_rule_source() == (ra.PACKAGED_KERNEL_RULE, "the packaged rule")
    assert ra.cuda_kernel_rule() == {"first_layer": "materialized", "later_layers": "materialized"}


def test_no_cuda_means_no_fused_bias_backend():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert ra.bias_has_fused_backend(CUDA) is False
    assert ra.bias_has_fused_backend(torch.device("cpu")) is False


@pytest.mark.parametrize("kernel", ["bias"])
def test_training_cross_attention_runs_materialized_on_the_alignment_layer_only(monkeypatch, kernel):
    """What docs/performance.md states: fairseq's decoder asks its alignment layer (the last)
    for cross-attention weights on every forward, training included, so that one layer's
    cross attention runs materialized and the others the chosen kernel."""
    d = make_dictionary()
    model = build(dictionary=d, residual_attention_kernel=kernel, decoder_layers=3)
    model.train()
    src, lengths, tgt = batch(d)
    ran = record_kernels(monkeypatch)
    out, extra = model(src, lengths, tgt)
    out.sum().backward()
    first = {}
    for module, name in ran:
        first.setdefault(module, name)
    assert [first[layer.encoder_attn] for layer in model.decoder.layers] == [kernel, kernel, "materialized"]
    assert extra["attn"][0] is not None and extra["attn"][0].requires_grad
