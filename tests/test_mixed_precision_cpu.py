"""Mixed precision through fairseq's own trainer, on CPU (no GPU needed).

``realformer_tools.fairseq_fixes.bf16_without_tpu`` (one of the launcher's default fixes)
makes ``fairseq-train --cpu --bf16`` and ``--memory-efficient-bf16`` run fairseq's real bf16
path: the model cast by fairseq's ``Trainer``, ``FP16Optimizer`` (fp32 master weights) or
``MemoryEfficientFP16Optimizer`` (fp32 optimizer state only), no loss scaler (fairseq's choice
for bf16). These tests prove it trains: the model's parameters are bf16 during training, the
loss goes down, nothing overflows, checkpoints load and resume, and ``fairseq-generate --bf16``
decodes in bf16 (``bf16_decoding``, the launcher's ``--bf16-decoding``). ``--fp16`` on CPU,
which fairseq cannot survive (its overflow handling calls CUDA), is refused at once with one
sentence. The RealFormer running sum stays float32 and finite, also 48 layers deep.
"""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import TINY_FLAGS, load_checkpoint
from conftest import USER_DIR, batch, build, trains
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.optim import FP16Optimizer, MemoryEfficientFP16Optimizer
from fairseq.trainer import Trainer
from inprocess import run_in_process

from realformer_nmt.errors import ConfigError
from realformer_nmt.modules import ResidualMultiheadAttention
from realformer_tools.fairseq_fixes import bf16_decoding, bf16_without_tpu

TRAIN_INNER = re.compile(r"\| train_inner \|.*? loss=([-\d.na]+),.*?num_updates=(\d+)(.*)")
UPDATES = 30
LOG_EVERY = 5


def train_losses(log):
    """[(num_updates, loss, rest of line)] from fairseq's train_inner log lines."""
    return [(int(u), float(loss), rest) for loss, u, rest in TRAIN_INNER.findall(log)]


def training_log(proc):
    """What the run logged, less the launcher's lines about its fixes (their names and, at
    ``--verbose``, what each changes: torch_xla and loss-scaler words among them)."""
    return "".join(line for line in (proc.stdout + proc.stderr).splitlines(keepends=True)
                   if " | realformer_tools.fairseq_fixes | " not in line)


def assert_trained(proc, updates=UPDATES):
    log = training_log(proc)
    points = train_losses(log)
    assert [u for u, _, _ in points] == list(range(LOG_EVERY, updates + 1, LOG_EVERY)), log[-2000:]
    losses = [loss for _, loss, _ in points]
    assert all(loss == loss and loss < 100 for loss in losses), losses  # finite, not diverged
    # measured: 4.2 at update 5 -> 3.4 at update 30 (bf16 and fp32 alike)
    assert losses[-1] < losses[0] - 0.8, losses
    return log, points


def running_sums(states):
    """The float32 ``A_n`` of each collected residual state (bare tensor or ResidualState)."""
    out = []
    for s in states:
        if s is None:
            continue
        out.append(s if torch.is_tensor(s) else s.running_sum())
    return out


def collect_states(model):
    states = []
    for m in model.modules():
        if isinstance(m, ResidualMultiheadAttention) and m.residual:
            m.register_forward_hook(lambda mod, args, kwargs, out: states.append(kwargs["residual_path"].state),
                                    with_kwargs=True)
    return states


# --------------------------------------------------------------------------------------
# what fairseq does alone (tells when the patch is no longer needed)
# --------------------------------------------------------------------------------------


@pytest.fixture
def fairseq_alone():
    bf16_without_tpu.uninstall()
    bf16_decoding.uninstall()
    try:
        yield
    finally:
        bf16_without_tpu.install()
        bf16_decoding.install()


def parse_train_args(*flags):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=[str(f) for f in flags])


def tiny_optimizer_cfg(*flags):
    args = parse_train_args("/nonexistent", "--arch", "transformer", "--optimizer", "adam", "--lr", "1e-3", *flags)
    return convert_namespace_to_omegaconf(args)


def test_fairseq_alone_cannot_train_mixed_precision_on_cpu(fairseq_alone, data_bin, tmp_path, monkeypatch):
    # 1. --bf16 means --tpu, and the trainer then asks torch_xla for its device
    assert parse_train_args("/nonexistent", "--arch", "transformer", "--cpu", "--bf16").tpu
    # 2. generate/interactive/hub leave the model in float32 under --bf16
    model = build()
    model.prepare_for_inference_(tiny_optimizer_cfg("--cpu", "--bf16"))
    assert next(model.parameters()).dtype == torch.float32
    # 3. --fp16: the flat fp32 master buffer is keyed by the current CUDA device ...
    cfg = tiny_optimizer_cfg("--cpu", "--fp16")
    with pytest.raises((AssertionError, RuntimeError), match="CUDA|cuda"):
        FP16Optimizer.build_optimizer(cfg, [torch.nn.Parameter(torch.zeros(3, dtype=torch.half))])
    # ... and without it, training runs until the loss scaler's first overflow, which
    # Trainer.train_step answers with torch.tensor(0.0).cuda()
    with pytest.raises((AssertionError, RuntimeError), match="CUDA|cuda"):
        train_in_process(data_bin, tmp_path, monkeypatch, "transformer", "--fp16", "--fp16-no-flatten-grads",
                         "--fp16-init-scale", 2**20)


def torch_xla_importable():
    try:
        import torch_xla.core.xla_model  # noqa: F401
    except ImportError:
        return False
    return True


def test_patch_keeps_tpu_off_on_cpu_but_honours_an_explicit_tpu():
    base = ("/nonexistent", "--arch", "transformer")
    assert not parse_train_args(*base, "--cpu", "--bf16").tpu
    assert not parse_train_args(*base, "--cpu", "--memory-efficient-bf16").tpu
    assert parse_train_args(*base, "--cpu", "--memory-efficient-bf16").bf16
    assert parse_train_args(*base, "--cpu", "--bf16", "--tpu").tpu
    # without --cpu, --bf16 still means a TPU where torch_xla can provide one (fairseq's own
    # test for a TPU: ``import torch_xla.core.xla_model`` succeeds)
    assert parse_train_args(*base, "--bf16").tpu == torch_xla_importable()
    bf16_without_tpu.install()  # idempotent: a second install wraps nothing twice
    assert not hasattr(options.parse_args_and_arch.__wrapped__, "__wrapped__")
    assert not hasattr(BaseFairseqModel.prepare_for_inference_.__wrapped__, "__wrapped__")
    assert not hasattr(Trainer.__init__.__wrapped__, "__wrapped__")


# --------------------------------------------------------------------------------------
# in-process: what the trainer holds during real updates
# --------------------------------------------------------------------------------------


def train_in_process(data_bin, save_dir, monkeypatch, arch, *flags, updates=3):
    """fairseq_cli.train.main for a few updates; returns what the trainer held at each step."""
    from fairseq_cli import train

    seen = []
    original = Trainer.train_step

    def changed(before, after):
        return sum(not torch.equal(b, a) for b, a in zip(before, after))

    def spy(self, samples, raise_oom=False):
        if not seen:
            seen.append({"states": collect_states(self.model)})
        masters = getattr(self.optimizer, "fp32_params", [])
        before = [p.detach().clone() for p in self.model.parameters()]
        masters_before = [p.detach().clone() for p in masters]
        out = original(self, samples, raise_oom)
        seen.append({
            "param_dtypes": {p.dtype for p in self.model.parameters()},
            "changed": changed(before, self.model.parameters()),
            "masters_changed": changed(masters_before, masters),
            "n_params": len(before),
            "optimizer": self.optimizer,
            "loss": out["loss"] if out else None,
        })
        return out

    monkeypatch.setattr(Trainer, "train_step", spy)
    args = parse_train_args(
        data_bin, "--user-dir", USER_DIR, "--arch", arch, *TINY_FLAGS, "--dropout", "0.1",
        "--max-update", updates, "--no-save", "--save-dir", save_dir, "--disable-validation", *flags,
    )
    train.main(convert_namespace_to_omegaconf(args))
    return seen[0]["states"], seen[1:]


@pytest.mark.slow  # 10-20 s under load: full suite only
@pytest.mark.parametrize("arch,flag,dtype,wrapper", [
    ("realformer_transformer", "--bf16", torch.bfloat16, FP16Optimizer),
    ("realformer_transformer", "--memory-efficient-bf16", torch.bfloat16, MemoryEfficientFP16Optimizer),
    ("transformer", "--bf16", torch.bfloat16, FP16Optimizer),
])
def test_trainer_updates_a_low_precision_model_through_fairseq_optimizers(
    data_bin, tmp_path, monkeypatch, arch, flag, dtype, wrapper
):
    states, steps = train_in_process(data_bin, tmp_path, monkeypatch, arch, "--cpu", flag)
    assert len(steps) == 3
    for step in steps:
        assert step["param_dtypes"] == {dtype}  # the model itself is bf16 while it trains
        assert type(step["optimizer"]) is wrapper
        # real updates. Adam moves every weight by ~lr = 1e-3, less than bf16's spacing
        # near 1.0 (2^-7): LayerNorm gains of the bf16 model may stay put for a while,
        # which is what the fp32 master weights are for: all of those move.
        assert step["changed"] >= 0.75 * step["n_params"], step
        if wrapper is FP16Optimizer:
            assert step["masters_changed"] == step["n_params"], step
        assert step["loss"] == step["loss"] and step["loss"] > 0
    opt = steps[-1]["optimizer"]
    if wrapper is FP16Optimizer:
        masters = opt.fp32_params
        assert len(masters) == steps[-1]["n_params"]
        assert all(p.dtype == torch.float32 for p in masters)
        # the low-precision model is the rounded fp32 master copy
        for p16, p32 in zip(opt.fp16_params, masters):
            assert torch.equal(p16.data, p32.data.to(dtype))
    else:
        # memory-efficient: no master copy, but Adam's moments are fp32
        exp_avgs = [s["exp_avg"] for s in opt.optimizer.state.values()]
        assert exp_avgs and all(m.dtype == torch.float32 for m in exp_avgs)
    assert opt.scaler is None  # fairseq's choice for bf16: no loss scaling
    if arch == "realformer_transformer":
        sums = running_sums(states)
        assert len(sums) == 3 * 2 * 3  # 3 updates x 2 layers x 3 paths (no validation)
        assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in sums)


# --------------------------------------------------------------------------------------
# through the real fairseq-train / fairseq-generate
# --------------------------------------------------------------------------------------


def run(tool, *args, check=True, bf16_decoding=False):
    """``tool`` in this process (tests/inprocess.py: the launcher's ``main``, its default fixes, with
    ``--bf16-decoding`` if asked; stdout, stderr and exit status as a subprocess gives them)."""
    return run_in_process(tool, *args, check=check, bf16_decoding=bf16_decoding)


def cli_train(data_bin, save, *flags, arch="realformer_transformer", updates=UPDATES):
    return run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", arch, *TINY_FLAGS,
        "--log-interval", LOG_EVERY, "--max-update", updates, "--save-dir", save, *flags,
    )


@pytest.fixture(scope="module")
@trains
def bf16_run(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("bf16")
    return save, cli_train(data_bin, save, "--bf16")


@pytest.mark.slow
def test_cli_bf16_trains_and_saves_a_bf16_checkpoint(bf16_run):
    save, proc = bf16_run
    log, _ = assert_trained(proc)
    assert "overflow" not in log and "xla" not in log
    state = load_checkpoint(save / "checkpoint_last.pt")  # weights only, fairseq's types allowed
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    # fairseq saves every model as float32 (utils.move_to_cpu upcasts half/bf16), so the
    # weights of a bf16 model are float32 tensors holding bf16 values exactly
    weights = [t for t in state["model"].values() if t.is_floating_point()]
    assert weights and all(t.dtype == torch.float32 for t in weights)
    assert all(torch.equal(t, t.to(torch.bfloat16).float()) for t in weights)
    adam = state["last_optimizer_state"]["state"]
    assert adam and all(s["exp_avg"].dtype == torch.float32 for s in adam.values())


def generate(data_bin, ckpt, *flags):
    proc = run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", "test",
        "--beam", 3, "--cpu", "--batch-size", 16, *flags, bf16_decoding=True,
    )
    hyps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            sid, score, text = line.split("\t")
            hyps[int(sid[2:])] = (float(score), text)
    return hyps


def test_cli_generate_bf16_decodes_in_bf16(data_bin, bf16_run):
    save, _ = bf16_run
    ckpt = save / "checkpoint_best.pt"
    fp32 = generate(data_bin, ckpt)
    bf16 = generate(data_bin, ckpt, "--bf16")
    assert sorted(bf16) == sorted(fp32) == list(range(40))
    diffs = [abs(bf16[i][0] - fp32[i][0]) for i in fp32]
    # the same weights in bf16: other scores (so bf16 really ran), but close ones
    assert max(diffs) > 0
    assert sum(diffs) / len(diffs) < 0.05, diffs
    same = sum(bf16[i][1] == fp32[i][1] for i in fp32)
    assert same >= 32, f"only {same}/40 identical hypotheses"


@pytest.mark.slow
def test_cli_memory_efficient_bf16_trains_and_resumes(data_bin, tmp_path):
    proc = cli_train(data_bin, tmp_path, "--memory-efficient-bf16")
    log, _ = assert_trained(proc)
    assert "overflow" not in log
    more = cli_train(data_bin, tmp_path, "--memory-efficient-bf16", updates=UPDATES + 10)
    log = more.stdout + more.stderr
    assert f"@ {UPDATES} updates" in log  # resumed from checkpoint_last.pt
    points = train_losses(log)
    assert [u for u, _, _ in points] == [UPDATES + 5, UPDATES + 10]
    first = train_losses(proc.stdout + proc.stderr)
    assert all(loss < first[-1][1] + 0.3 for _, loss, _ in points)  # continued, not restarted


@pytest.mark.slow
def test_cli_fp16_on_cpu_is_refused_at_once_with_one_sentence(data_bin, tmp_path):
    proc = run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
               *TINY_FLAGS, "--max-update", 5, "--save-dir", tmp_path, "--fp16", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"realformer_nmt: error: {bf16_without_tpu.FP16_ON_CPU}"
    assert "Traceback" not in proc.stderr and "train_inner" not in proc.stderr + proc.stdout
    assert not list(tmp_path.iterdir())  # nothing trained, nothing saved


def test_memory_efficient_fp16_on_cpu_is_refused_before_training(data_bin, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="--bf16"):
        train_in_process(data_bin, tmp_path, monkeypatch, "realformer_transformer", "--memory-efficient-fp16")


# --------------------------------------------------------------------------------------
# numerics of the RealFormer itself in bf16
# --------------------------------------------------------------------------------------


DEEP = dict(encoder_layers=48, decoder_layers=48, encoder_embed_dim=16, decoder_embed_dim=16,
            encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16,
            encoder_attention_heads=2, decoder_attention_heads=2)


def nll(model, dictionary, bsz=4, src_len=10, tgt_len=9):
    src, lengths, tgt = batch(dictionary, bsz=bsz, src_len=src_len, tgt_len=tgt_len)
    logits, _ = model(src, lengths, tgt)
    lprobs = F.log_softmax(logits.float(), dim=-1)
    target = torch.roll(tgt, -1, dims=1)
    return F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.reshape(-1)), logits


@pytest.mark.slow  # 10-20 s under load: full suite only
@pytest.mark.parametrize("kernel", ["materialized", "bias"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_48_layer_realformer_trains_finite_in_bf16(dictionary, mode, kernel):
    model = build(dictionary=dictionary, residual_attention_mode=mode, residual_attention_kernel=kernel,
                  **DEEP).to(torch.bfloat16).train()
    states = collect_states(model)
    loss, logits = nll(model, dictionary)
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert torch.isfinite(loss)
    sums = running_sums(states)
    assert len(sums) == 48 * 3
    # no score overflow: every running sum A_n is a finite float32 tensor
    assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in sums)
    if kernel == "materialized":
        assert all(s.scores is not None and s.scores.dtype == torch.float32 for s in states if s is not None
                   and not torch.is_tensor(s))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == sum(1 for _ in model.parameters())
    assert all(torch.isfinite(g).all() for g in grads)
    # gradient reaches the first layers of a 48-layer stack
    first = model.encoder.layers[0].self_attn.q_proj.weight.grad
    assert first.abs().sum() > 0


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bf16_realformer_loss_and_gradients_match_fp32(dictionary, mode):
    """The same weights in bf16 and fp32 give close losses and gradients (6+6 layers)."""
    fp32 = build(dictionary=dictionary, residual_attention_mode=mode, encoder_layers=6, decoder_layers=6).train()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    loss32, _ = nll(fp32, dictionary)
    loss16, _ = nll(bf16, dictionary)
    loss32.backward()
    loss16.backward()
    # measured: relative loss difference 2e-4 (mean) / 4e-4 (sum), cosine 0.9995+
    assert abs(loss16.item() - loss32.item()) / loss32.item() < 5e-3, (loss16.item(), loss32.item())
    g32 = torch.cat([p.grad.flatten() for p in fp32.parameters()])
    g16 = torch.cat([p.grad.float().flatten() for p in bf16.parameters()])
    assert F.cosine_similarity(g32, g16, dim=0) > 0.995
