"""Exactness of every kernel against ``materialized`` on one device, in float32, per
parameter tensor (``make gpu-check GPU_CHECK_ARGS=--quick``; the dry run on the CPU).

* A 6+6 ``realformer_transformer`` with every path on (encoder, decoder, cross), sum and
  mean: each kernel (``bias``, ``fused``, ``auto``) against ``materialized`` with the same
  weights and batch (left-padded sources, padded targets), training mode without dropout:
  the output and the gradient of **each parameter tensor**, every layer's ``q_proj`` and
  ``k_proj`` included, within a relative error of 1e-4 (``||g - g_ref|| / ||g_ref||``).
  The ``k_proj.bias`` tensors, whose exact gradient is zero (a softmax does not see a
  constant added to a row), must instead have a gradient norm (theirs and the reference's:
  rounding noise) below ``FLOOR`` times the largest tensor's; that floor is also the
  smallest denominator of a relative error, and a ``q_proj`` / ``k_proj`` weight whose
  reference gradient is below it fails (the check would not see a lost gradient there).
* One ``bias`` layer on a running sum that needs a gradient (what training runs): its
  output and the sum's gradient (SDPA's mask gradient) against ``materialized``.
* Which SDPA backend ran for that ``bias`` layer, forward and backward: the ``aten`` op
  names and device kernel names ``torch.profiler`` records.
"""

import argparse
import re
import types
from collections import Counter
from typing import Dict, List

import torch

RELATIVE_TOLERANCE = 1e-4
FLOOR = 1e-4
KERNELS = ("bias", "fused", "auto")
MODES = ("sum", "mean")

# aten op -> SDPA backend (torch.nn.attention.SDPBackend names)
BACKEND_OPS = (
    ("_scaled_dot_product_efficient_attention", "EFFICIENT_ATTENTION"),
    ("_efficient_attention", "EFFICIENT_ATTENTION"),
    ("_scaled_dot_product_cudnn_attention", "CUDNN_ATTENTION"),
    ("_cudnn_attention", "CUDNN_ATTENTION"),
    ("_scaled_dot_product_flash_attention", "FLASH_ATTENTION"),
    ("_flash_attention", "FLASH_ATTENTION"),
    ("_scaled_dot_product_attention_math", "MATH"),
)
_ATTENTION_NAME = re.compile(r"attention|fmha|flash|cudnn|sdp", re.IGNORECASE)


def model_args(dims: Dict[str, int], kernel: str, mode: str, arch: str = "realformer_transformer"):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(
        encoder_layers=dims["layers"], decoder_layers=dims["layers"],
        encoder_embed_dim=dims["embed"], decoder_embed_dim=dims["embed"],
        encoder_ffn_embed_dim=2 * dims["embed"], decoder_ffn_embed_dim=2 * dims["embed"],
        encoder_attention_heads=dims["heads"], decoder_attention_heads=dims["heads"],
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        residual_attention_kernel=kernel, residual_attention_mode=mode,
    )
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build(dims, kernel, mode, device, seed=1):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    import realformer_nmt  # noqa: F401  (registers the arch)

    d = Dictionary()
    for i in range(dims["vocab"]):
        d.add_symbol(f"w{i}")
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY["realformer_transformer"].build_model(model_args(dims, kernel, mode), task)
    with torch.no_grad():  # peaked attention, so that the residual scores matter
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(3.0)
    return model.to(device).train(), d


def make_batch(d, dims, device, seed=2):
    g = torch.Generator().manual_seed(seed)
    bsz, src_len, tgt_len = dims["batch"], dims["src_len"], dims["tgt_len"]
    src = torch.randint(d.nspecial, len(d), (bsz, src_len), generator=g)
    src[:, -1] = d.eos()
    for row in range(1, bsz, 2):  # left-padded sources, as fairseq's translation task makes
        src[row, : row % (src_len // 2) + 1] = d.pad()
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    tgt[:, 0] = d.eos()
    tgt[0, -2:] = d.pad()  # right-padded targets
    lengths = src.ne(d.pad()).sum(1)
    return src.to(device), lengths.to(device), tgt.to(device)


def forward_backward(model, batch):
    src, lengths, tgt = batch
    model.zero_grad(set_to_none=True)
    out, _ = model(src, lengths, tgt)
    weights = torch.linspace(0.5, 1.5, out.numel(), device=out.device).view_as(out)
    (out.float() * weights).sum().backward()
    grads = {name: (p.grad.detach().float().clone() if p.grad is not None else None)
             for name, p in model.named_parameters()}
    return out.detach().float(), grads


def relative(x, ref, floor=0.0) -> float:
    return float((x - ref).norm() / max(float(ref.norm()), floor, 1e-30))


def compare_gradients(grads, ref) -> dict:
    norms = {n: float(g.norm()) for n, g in ref.items() if g is not None}
    floor = FLOOR * max(norms.values())
    errors, problems, zeros = {}, [], {}
    for name, want in ref.items():
        got = grads.get(name)
        if want is None:
            continue
        if got is None:
            problems.append(f"{name}: no gradient")
            errors[name] = None
            continue
        if name.endswith("k_proj.bias"):
            # exact gradient zero: both must be rounding noise, below the floor
            zeros[name] = dict(norm=float(got.norm()), reference_norm=norms[name])
            if max(float(got.norm()), norms[name]) > floor:
                problems.append(f"{name}: gradient norm {float(got.norm()):.2e} (exactly zero in theory) "
                                f"above the floor {floor:.2e}")
            continue
        errors[name] = relative(got, want, floor)
        if errors[name] > RELATIVE_TOLERANCE:
            problems.append(f"{name}: relative error {errors[name]:.2e}")
    projections = [n for n in ref if re.search(r"(self_attn|encoder_attn)\.[qk]_proj\.weight$", n)]
    weak = [n for n in projections if norms.get(n, 0.0) <= floor]
    problems += [f"{n}: reference gradient below the floor (a lost path would not show)" for n in weak]
    worst = max((e for e in errors.values() if e is not None), default=None)
    worst_name = max(errors, key=lambda n: -1 if errors[n] is None else errors[n]) if errors else None
    return dict(tensors=len(errors), q_k_projections=len(projections), floor=floor, max_relative=worst,
                worst_tensor=worst_name, zero_gradient_tensors=len(zeros),
                max_zero_gradient_norm=max((z["norm"] for z in zeros.values()), default=None),
                problems=problems)


def model_agreement(device, dims, log=print) -> List[dict]:
    checks = []
    for mode in MODES:
        ref_model, d = build(dims, "materialized", mode, device)
        batch = make_batch(d, dims, device)
        ref_out, ref_grads = forward_backward(ref_model, batch)
        for kernel in KERNELS:
            model, _ = build(dims, kernel, mode, device)
            out, grads = forward_backward(model, batch)
            result = compare_gradients(grads, ref_grads)
            result["output_relative"] = relative(out, ref_out)
            if result["output_relative"] > RELATIVE_TOLERANCE:
                result["problems"].insert(0, f"output: relative error {result['output_relative']:.2e}")
            name = f"{kernel} vs materialized ({mode})"
            status = "failed" if result["problems"] else "passed"
            log(f"exactness: {name}: {status}, max relative error {result['max_relative']:.2e} over "
                f"{result['tensors']} tensors")
            checks.append(dict(name=name, status=status, reason="; ".join(result["problems"][:5]) or None,
                               kernel=kernel, mode=mode, **result))
    return checks


def _bias_layer_inputs(device, dims, seed=3):
    from realformer_nmt.modules import ResidualMultiheadAttention
    from realformer_nmt.modules.residual_attention import ResidualState

    embed, heads, bsz, length = dims["embed"], dims["heads"], dims["batch"], dims["src_len"]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(length, bsz, embed, generator=g).to(device)
    prev = (3.0 * torch.randn(bsz, heads, length, length, generator=g)).to(device)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[0, -2:] = True
    pad = pad.to(device)

    def layer(kernel):
        torch.manual_seed(seed)
        return ResidualMultiheadAttention(embed, heads, self_attention=True, residual=True, mode="mean",
                                          kernel=kernel).to(device)

    def state():
        scores = prev.clone().requires_grad_(True)
        return scores, ResidualState.of_scores(scores, terms=1)

    return x, pad, layer, state


def mask_gradient(device, dims) -> dict:
    """One ``bias`` layer on a running sum that needs a gradient against ``materialized``."""
    x, pad, layer, state = _bias_layer_inputs(device, dims)
    results = {}
    for kernel in ("materialized", "bias"):
        module = layer(kernel)
        scores, prev = state()
        out, _, _ = module(x, x, x, key_padding_mask=pad, prev_state=prev, need_weights=False)
        weights = torch.linspace(0.5, 1.5, out.numel(), device=out.device).view_as(out)
        (out * weights).sum().backward()
        results[kernel] = (out.detach(), scores.grad.detach().clone(),
                           {n: p.grad.detach().clone() for n, p in module.named_parameters()})
    ref_out, ref_mask, ref_params = results["materialized"]
    out, mask, params = results["bias"]
    errors = dict(output=relative(out, ref_out), mask_gradient=relative(mask, ref_mask))
    errors.update({n: relative(params[n], ref_params[n], FLOOR * float(ref_params[n].norm() + 1e-30))
                   for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight")})
    bad = [f"{k}: relative error {v:.2e}" for k, v in errors.items() if v > RELATIVE_TOLERANCE]
    if float(ref_mask.norm()) == 0.0:
        bad.append("the reference mask gradient is zero")
    return dict(name="bias layer: mask gradient vs materialized", status="failed" if bad else "passed",
                reason="; ".join(bad) or None, relative_errors=errors)


def backend_of(op_name: str):
    for fragment, backend in BACKEND_OPS:
        if fragment in op_name:
            return backend
    return None


def sdpa_backends(device, dims) -> dict:
    """The SDPA ops and device kernels ``torch.profiler`` records for one ``bias`` layer on a
    running sum that needs a gradient, forward and backward separately."""
    from torch.profiler import ProfilerActivity, profile

    x, pad, layer, state = _bias_layer_inputs(device, dims)
    module = layer("bias")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])

    def names(prof):
        ops, kernels = Counter(), Counter()
        for event in prof.events():
            if not _ATTENTION_NAME.search(event.name):
                continue
            on_device = str(getattr(event, "device_type", "")).endswith("CUDA")
            (kernels if on_device else ops)[event.name[:160]] += 1
        return ops, kernels

    scores, prev = state()
    with profile(activities=activities) as prof:
        out, _, _ = module(x, x, x, key_padding_mask=pad, prev_state=prev, need_weights=False)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    forward_ops, forward_kernels = names(prof)
    with profile(activities=activities) as prof:
        out.sum().backward()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    backward_ops, backward_kernels = names(prof)
    record = {}
    for phase, ops, kernels in (("forward", forward_ops, forward_kernels), ("backward", backward_ops,
                                                                          backward_kernels)):
        backends = sorted({b for b in map(backend_of, ops) if b})
        record[phase] = dict(backends=backends or ["no SDPA op recorded"], ops=dict(ops),
                             device_kernels=dict(kernels))
    return record


def check_backends(record, device) -> dict:
    """On CUDA the ``bias`` layer must have run on the memory-efficient backend both ways (a
    ``materialized`` fallback is exact but not what ``bias`` is for); elsewhere there is no
    target: what ran is ``reported``, not judged (the CPU runs SDPA's math kernel forward for
    a mask with a gradient, and its backward records no SDPA op)."""
    forward, backward = record["forward"]["backends"], record["backward"]["backends"]
    if torch.device(device).type != "cuda":
        return dict(name="bias layer: SDPA backend", status="reported",
                    reason=f"not CUDA, not judged: recorded what ran (forward {forward}, backward {backward})",
                    **record)
    ok = forward == ["EFFICIENT_ATTENTION"] and backward == ["EFFICIENT_ATTENTION"]
    return dict(name="bias layer: SDPA backend", status="passed" if ok else "failed",
                reason=None if ok else f"expected EFFICIENT_ATTENTION both ways, ran forward {forward}, "
                                       f"backward {backward}", **record)


def run(device, dims, log=print) -> List[dict]:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on Ampere and later
    torch.backends.cudnn.allow_tf32 = False
    checks = model_agreement(device, dims, log)
    checks.append(mask_gradient(device, dims))
    checks.append(check_backends(sdpa_backends(device, dims), device))
    for c in checks[-2:]:
        log(f"exactness: {c['name']}: {c['status']}" + (f" ({c['reason']})" if c["reason"] else ""))
    return checks
