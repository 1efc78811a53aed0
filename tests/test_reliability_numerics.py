"""Numeric safety: deep stacks in low precision, degenerate inputs, fp16 loss scaling."""

import subprocess

import pytest
import torch
from conftest import BIN, USER_DIR, attend, batch, build, cli_env
from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

from realformer_nmt.modules import ResidualMultiheadAttention

DEEP = dict(encoder_layers=48, decoder_layers=48, encoder_embed_dim=16, decoder_embed_dim=16,
            encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16,
            encoder_attention_heads=2, decoder_attention_heads=2)


def collect_scores(model):
    scores = []
    for m in model.modules():
        if isinstance(m, ResidualMultiheadAttention):
            m.register_forward_hook(
                lambda mod, args, kwargs, out: scores.append(kwargs["residual_path"].state.running_sum()),
                with_kwargs=True)
    return scores


@pytest.mark.slow  # 10-20 s under load: full suite only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_48_layer_stack_stays_finite_in_low_precision(dictionary, mode, dtype):
    model = build(dictionary=dictionary, residual_attention_mode=mode, **DEEP).to(dtype)
    scores = collect_scores(model)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        logits, _ = model(src, lengths, tgt)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    assert len(scores) == 48 * 3
    assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in scores)


def test_running_sum_does_not_overflow_where_fp16_would():
    """Per-layer logits of ~1600 summed over 48 layers exceed fp16's 65504: a running
    sum kept in fp16 becomes inf; ours (float32) stays finite."""
    torch.manual_seed(0)
    layers = [
        ResidualMultiheadAttention(16, 2, self_attention=True, residual=True, kernel="materialized").half()
        for n in range(48)
    ]
    for m in layers:
        with torch.no_grad():
            m.q_proj.weight.fill_(1.5), m.k_proj.weight.fill_(1.5)
            m.q_proj.bias.zero_(), m.k_proj.bias.zero_()
    x = torch.ones(4, 1, 16, dtype=torch.float16)
    state, fp16_sum = None, torch.zeros(1, 2, 4, 4, dtype=torch.float16)
    with torch.no_grad():
        for m in layers:
            before = 0 if state is None else state.scores
            out, _, state = attend(m, x, x, x, prev_state=state)
            fp16_sum = fp16_sum + (state.scores - before).half()  # this layer's own logits
    prev = state.scores
    assert torch.isinf(fp16_sum).all()  # what an fp16 running sum would have done
    assert torch.isfinite(prev).all() and prev.min() > 65504
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_length_one_and_fully_padded_inputs_give_no_nan(dictionary, mode):
    model = build(dictionary=dictionary, residual_attention_mode=mode)
    eos, pad = dictionary.eos(), dictionary.pad()
    src = torch.tensor([[eos], [eos]])
    tgt = torch.tensor([[eos], [eos]])
    with torch.no_grad():
        logits, _ = model(src, torch.tensor([1, 1]), tgt)
        assert torch.isfinite(logits).all()
        # a row whose every source key is padding (its length-0 "sentence")
        src = torch.tensor([[pad, pad, pad], [5, 6, eos]])
        tgt = torch.tensor([[eos, 5], [eos, 6]])
        logits, _ = model(src, torch.tensor([0, 3]), tgt)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_fp16_loss_scaler_sees_no_overflow_on_a_normal_batch(dictionary, mode):
    """What fairseq's FP16Optimizer does each step, on a half-precision model: scale the
    loss (fairseq's default initial scale, 128), backward, check the gradient norm."""
    model = build(dictionary=dictionary, residual_attention_mode=mode, dropout=0.1).half().train()
    scaler = DynamicLossScaler(init_scale=128)
    src, lengths, tgt = batch(dictionary, bsz=8, src_len=12, tgt_len=10)
    target = torch.roll(tgt, -1, dims=1)
    logits, _ = model(src, lengths, tgt)
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.reshape(-1), reduction="sum")
    scaler.scale(loss).backward()
    grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    grad_norm = torch.stack(grads).norm()
    scaler.check_overflow(grad_norm)  # raises OverflowError on inf/nan
    assert torch.isfinite(grad_norm) and grad_norm > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fairseq_train_fp16_on_gpu_keeps_loss_scale(tmp_path):
    """On a GPU: fairseq-train --fp16 runs without the loss scaler ever overflowing."""
    from cli_helpers import write_reversal_corpus

    write_reversal_corpus(tmp_path)
    subprocess.run(
        [str(BIN / "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", tmp_path / "train", "--validpref", tmp_path / "valid",
         "--destdir", tmp_path / "bin", "--joined-dictionary", "--workers", "1"],
        check=True, capture_output=True, env=cli_env(),
    )
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), tmp_path / "bin", "--user-dir", USER_DIR,
         "--arch", "realformer_transformer", "--fp16", "--encoder-layers", "6", "--decoder-layers", "6",
         "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "2000", "--max-update", "50",
         "--save-dir", tmp_path / "ckpt", "--no-progress-bar", "--log-interval", "10"],
        capture_output=True, text=True, env=cli_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gradient overflow detected" not in proc.stdout + proc.stderr
