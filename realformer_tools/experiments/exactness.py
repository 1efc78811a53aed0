"""Exactness of every kernel, judged by yardsticks measured in the same run on the same
device (``make gpu-check GPU_CHECK_ARGS=--quick``; its dry run on the CPU, in CI).

Models: a 6+6 ``realformer_transformer`` with every path on (encoder, decoder, cross), in
training mode without dropout, one batch (left-padded sources, padded targets), the same
weights for every kernel. Three variants (:data:`VARIANTS`): the *peaked* model (every
``q_proj`` / ``k_proj`` weight x3, so that the residual scores matter), sum and mean; the
*plain* model (x1), sum; and the plain model with GELU instead of ReLU, sum.

1. **The mathematics, in float64** (:func:`float64_proof`): each kernel (``bias``,
   ``fused``, ``auto``) against ``materialized``, both in float64, on the peaked model, sum
   and mean: the output and the gradient of each parameter tensor within a relative error
   of 1e-10 (:data:`FLOAT64_TOLERANCE`; float64 rounding is ~1e-16, so anything above is a
   difference in what is computed). Where the kernel cannot run in float64 on the device
   (on CUDA the ``bias`` kernel's memory-efficient SDPA backend has no float64: its calls
   run ``materialized``), the check says so and is ``reported``; the CPU proof covers it.
2. **float32 against float64** (:func:`model_agreement`): each kernel's distance to a
   float64 reference of the same model (``materialized`` in float64, same weights and
   batch), the output's relative error and the worst parameter tensor's, judged against
   two yardsticks measured in the same run: ``materialized``'s own distance, and fairseq's
   own attention's (``--residual-attention-paths none``, the same weights, against its own
   float64 reference). A kernel passes when both its distances are at most
   ``2 x`` the larger yardstick ``+ 1e-6`` (:data:`YARDSTICK_FACTOR`,
   :data:`YARDSTICK_SLACK`). Why not "kernel vs materialized <= 1e-4": two float32
   algorithms for one function differ by the function's conditioning times float32's
   rounding, and on the peaked model in sum mode that is ~3e-4 on CUDA for *every*
   implementation, fairseq's own attention included (H100, 2026-11-27): a fixed tolerance
   measures the model, not the kernel. Against float64, a kernel that computes something
   else, or loses accuracy (a kernel 10x less accurate than ``materialized`` fails:
   ``tests/test_gpu_quick.py``), stands out; one as accurate as the yardsticks passes.
   The factor 2 allows for the different summation orders of equally accurate
   algorithms (measured: 0.67-1.4x ``materialized``'s distance); the 1e-6 for a yardstick
   that happens to land near zero.

   **ReLU flips.** On a ReLU model a hidden unit whose pre-activation is within float32
   rounding of zero can be on in one implementation and off in float64; its whole
   contribution then enters or leaves that layer's ``fc1`` / ``fc2`` gradients, and the
   worst tensor jumps (H100, plain model, sum: ``bias`` / ``fused`` 1.5e-4 from float64,
   ``materialized`` 1.7e-6, worst tensor an ``fc1.weight``). The check counts, per kernel,
   the units whose ReLU state differs from float64's (``relu_flips``). A ReLU model's
   gradient above its limit, the worst tensor an ``fc1`` / ``fc2``, with a unit of that
   layer flipped in this kernel and not in ``materialized`` (``own_flips_in_layer``; a
   count alone cannot tell: on the H100, 2026-11-28, ``triton`` and ``materialized`` each
   flipped 3 units of the peaked model) is ``reported`` with that explanation, not passed; the GELU model
   (smooth: no unit switches, so no jump) is judged plainly and tells whether the
   explanation holds. The output (a flipped unit is ~0 either way) is judged plainly on
   every model.
3. **Per precision, reported** (:func:`precision_distances`): the same distances to float64
   in float16 and bfloat16, for every kernel and for fairseq's own attention (the numeric
   cost of the residual sum in half precision, beside fairseq's).
4. One ``bias`` layer on a running sum that needs a gradient (what training runs): its
   output and the sum's gradient (SDPA's mask gradient) against ``materialized``
   (relative error of 1e-4), and which SDPA backend ran for it, forward and backward (the
   ``aten`` op names and device kernel names ``torch.profiler`` records).

Relative errors are ``||x - ref|| / ||ref||`` per tensor. The ``k_proj.bias`` tensors,
whose exact gradient is zero (a softmax does not see a constant added to a row), must
instead have a gradient norm below ``FLOOR`` times the largest tensor's; that floor is
also the smallest denominator of a relative error, and a ``q_proj`` / ``k_proj`` weight
whose reference gradient is below it fails (the check would not see a lost gradient).
"""

import argparse
import contextlib
import copy
import dataclasses
import re
import types
from collections import Counter
from typing import Dict, List, Optional, Tuple

import torch

RELATIVE_TOLERANCE = 1e-4  # the bias layer's mask gradient against materialized (float32)
FLOOR = 1e-4
FLOAT64_TOLERANCE = 1e-10
YARDSTICK_FACTOR = 2.0
YARDSTICK_SLACK = 1e-6
KERNELS = ("bias", "fused", "auto")
MODES = ("sum", "mean")
HALF_DTYPES = (torch.float16, torch.bfloat16)


def measured_kernels(device) -> Tuple[str, ...]:
    """The kernels judged in float32 and in half precision on ``device``: ``KERNELS``, and on
    CUDA ``triton`` where it applies (``auto`` ran it there until 2026-11-28; it is judged by
    name since). Not on CPU, where it runs only in Triton's interpreter
    (tests/test_triton_kernel.py checks it there); not in the float64 proof, which Triton
    cannot compile on CUDA."""
    from realformer_nmt.modules.residual_attention import triton_kernel

    device = torch.device(device)
    if device.type == "cuda" and triton_kernel.unsupported(device, torch.float32) is None:
        return KERNELS + ("triton",)
    return KERNELS


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    qk_scale: float
    activation: str
    modes: Tuple[str, ...]

    def describe(self) -> str:
        return f"{self.name} model (q/k x{self.qk_scale:g}, {self.activation})"


VARIANTS = (
    Variant("peaked", 3.0, "relu", ("sum", "mean")),
    Variant("plain", 1.0, "relu", ("sum",)),
    Variant("plain-gelu", 1.0, "gelu", ("sum",)),
)

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


def model_args(dims: Dict[str, int], kernel: str, mode: str, arch: str = "realformer_transformer",
               activation: str = "relu", paths: Optional[str] = None):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(
        encoder_layers=dims["layers"], decoder_layers=dims["layers"],
        encoder_embed_dim=dims["embed"], decoder_embed_dim=dims["embed"],
        encoder_ffn_embed_dim=2 * dims["embed"], decoder_ffn_embed_dim=2 * dims["embed"],
        encoder_attention_heads=dims["heads"], decoder_attention_heads=dims["heads"],
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_fn=activation,
        residual_attention_kernel=kernel, residual_attention_mode=mode,
    )
    if paths is not None:
        args.residual_attention_paths = paths
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def dictionary(dims):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(dims["vocab"]):
        d.add_symbol(f"w{i}")
    return d


def build(dims, kernel, mode, device, seed=1, qk_scale=3.0, activation="relu", paths=None,
          dtype=torch.float32):
    """``(model, dictionary)``: the model in ``dtype`` on ``device``, training mode; the
    weights depend on ``seed``, ``qk_scale`` and the dims only (not on the kernel)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import realformer_nmt  # noqa: F401  (registers the arch)

    d = dictionary(dims)
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    torch.manual_seed(seed)
    args = model_args(dims, kernel, mode, activation=activation, paths=paths)
    model = ARCH_MODEL_REGISTRY["realformer_transformer"].build_model(args, task)
    with torch.no_grad():  # peaked attention, so that the residual scores matter
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(qk_scale)
    return model.to(device=device, dtype=dtype).train(), d


def with_kernel(model, kernel, device, dtype):
    """A copy of ``model`` (same weights) running ``kernel``, in ``dtype`` on ``device``."""
    from realformer_nmt.modules import ResidualMultiheadAttention

    twin = copy.deepcopy(model)
    for m in twin.modules():
        if isinstance(m, ResidualMultiheadAttention):
            m.kernel = kernel
    return twin.to(device=device, dtype=dtype).train()


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


def forward_backward(model, batch, activations=None):
    """``(output, {parameter: gradient})`` in float32 (float64 for a float64 model); with
    ``activations`` (a dict), every ``fc1`` output (the FFN's pre-activation) is kept there."""
    src, lengths, tgt = batch
    model.zero_grad(set_to_none=True)
    hooks = []
    if activations is not None:
        for name, m in model.named_modules():
            if name.endswith("fc1"):
                hooks.append(m.register_forward_hook(
                    lambda mod, inp, out, name=name: activations.__setitem__(name, out.detach())))
    try:
        out, _ = model(src, lengths, tgt)
    finally:
        for h in hooks:
            h.remove()
    wide = torch.float64 if out.dtype == torch.float64 else torch.float32
    weights = torch.linspace(0.5, 1.5, out.numel(), device=out.device, dtype=wide).view_as(out)
    (out.to(wide) * weights).sum().backward()
    grads = {name: (p.grad.detach().to(wide).clone() if p.grad is not None else None)
             for name, p in model.named_parameters()}
    return out.detach().to(wide), grads


def relative(x, ref, floor=0.0) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / max(float(ref.norm()), floor, 1e-300))


def relu_flips(acts, ref_acts) -> int:
    """Hidden units whose ReLU state (pre-activation > 0) differs from the reference's."""
    return flip_count(relu_flip_units(acts, ref_acts))


def flip_count(units: Dict[str, set]) -> int:
    return sum(len(u) for u in units.values())


def relu_flip_units(acts, ref_acts) -> Dict[str, set]:
    """Per ``fc1`` module, the flat indices (position, sentence, unit) of the hidden units
    whose ReLU state differs from the reference's."""
    return {n: set(torch.nonzero(((acts[n] > 0) != (ref_acts[n] > 0)).flatten()).flatten().tolist())
            for n in ref_acts if n in acts}


def own_flips_in_layer(units: Dict[str, set], materialized_units: Dict[str, set],
                       tensor: Optional[str]) -> Optional[int]:
    """How many units of ``tensor``'s ``fc1`` flip in this kernel but not in ``materialized``:
    the flips that move this kernel's gradient of that ``fc1`` tensor (a flipped unit's whole
    contribution enters or leaves it) and that materialized's distance does not share (an
    equal count of flips in other units or layers cannot tell). None for any other tensor: a
    flipped unit's output is ~0 either way, so it barely moves ``fc2``, and flips further down
    are not attributed here."""
    match = re.match(r"(.*)\.fc1\.", tensor or "")
    if not match:
        return None
    module = match.group(1) + ".fc1"
    return len(units.get(module, set()) - materialized_units.get(module, set()))


def compare_gradients(grads, ref, tolerance: Optional[float] = RELATIVE_TOLERANCE) -> dict:
    """Per parameter tensor: relative errors, the worst, and the problems: a gradient
    missing, a ``k_proj.bias`` gradient above the floor, a ``q_proj`` / ``k_proj`` weight
    whose reference gradient is below it, and (with ``tolerance``) errors above it."""
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
        if tolerance is not None and errors[name] > tolerance:
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


def distance(out, grads, ref_out, ref_grads) -> dict:
    """A model's distance to its reference: the output's relative error, the worst
    parameter tensor's (``max_relative``, ``worst_tensor``) and the structural problems."""
    result = compare_gradients(grads, ref_grads, tolerance=None)
    result["output_relative"] = relative(out, ref_out)
    return result


def _short(d: dict) -> dict:
    return dict(output=d["output_relative"], gradient=d["max_relative"], worst_tensor=d["worst_tensor"])


def limits(yardsticks: Dict[str, dict]) -> Tuple[float, float]:
    """``(output limit, gradient limit)``: 2x the larger yardstick plus 1e-6."""
    out = max(y["output"] for y in yardsticks.values())
    grad = max(y["gradient"] for y in yardsticks.values())
    return YARDSTICK_FACTOR * out + YARDSTICK_SLACK, YARDSTICK_FACTOR * grad + YARDSTICK_SLACK


def judge(kernel: str, mode: str, variant: Variant, d: dict, yardsticks: Dict[str, dict],
          flips: Optional[int] = None, materialized_flips: Optional[int] = None,
          own_flips: Optional[int] = None) -> dict:
    """The float32 check of one kernel (see the module docstring, 2.). ``own_flips``: the
    units of the worst tensor's layer that flip here and not in materialized
    (:func:`own_flips_in_layer`); where it is not known (a record from before it was
    measured), more flips than materialized's in all."""
    limit_out, limit_grad = limits(yardsticks)
    problems = list(d["problems"])
    explained = None
    if d["output_relative"] > limit_out:
        problems.append(f"output {d['output_relative']:.2e} from float64 > {limit_out:.2e} "
                        f"({YARDSTICK_FACTOR:g}x the larger yardstick + {YARDSTICK_SLACK:g})")
    if d["max_relative"] is not None and d["max_relative"] > limit_grad:
        text = (f"worst gradient {d['max_relative']:.2e} from float64 ({d['worst_tensor']}) > {limit_grad:.2e} "
                f"({YARDSTICK_FACTOR:g}x the larger yardstick + {YARDSTICK_SLACK:g})")
        ffn = bool(re.search(r"\.fc[12]\.", d["worst_tensor"] or ""))
        if own_flips is not None:
            flipped = own_flips > 0
            which = (f"{own_flips} hidden unit(s) of that layer on the other side of zero than in float64 that "
                     f"materialized has on the same side ({flips} flips in all, materialized {materialized_flips})")
        else:
            flipped = flips is not None and flips > (materialized_flips or 0)
            which = (f"{flips} hidden units on the other side of zero than in float64 (materialized: "
                     f"{materialized_flips})")
        if variant.activation == "relu" and flips is not None and flipped and ffn:
            explained = (f"{text}: explained by ReLU flips: {which}; reported, not judged; the gelu "
                         "model (no flips) is judged")
        else:
            problems.append(text)
    status = "failed" if problems else ("reported" if explained else "passed")
    reason = "; ".join(problems[:5]) if problems else explained
    return dict(name=f"{kernel} float32 vs float64 ({variant.name}, {mode})", status=status, reason=reason,
                kernel=kernel, mode=mode, model=variant.name, qk_scale=variant.qk_scale,
                activation=variant.activation, limit_output=limit_out, limit_gradient=limit_grad,
                yardsticks=yardsticks, relu_flips=flips, materialized_relu_flips=materialized_flips,
                own_relu_flips_in_worst_layer=own_flips,
                **{k: v for k, v in d.items() if k != "problems"}, problems=problems)


def _measure(base, kernel, device, dtype, batch, activations=False):
    model = with_kernel(base, kernel, device, dtype)
    acts = {} if activations else None
    out, grads = forward_backward(model, batch, acts)
    del model
    return out, grads, acts


def _measure_by_name(base, kernel, device, dtype, batch, activations=False):
    """``(_measure's result, None)``, or ``(None, the error)`` where ``triton``, judged by name,
    failed to compile or launch here: one failed check, not a stopped section. Any other
    kernel's error is raised."""
    try:
        return _measure(base, kernel, device, dtype, batch, activations), None
    except Exception as error:
        if kernel != "triton":
            raise
        return None, f"{type(error).__name__}: {error}"[:300]


def model_agreement(device, dims, log=print, variants=VARIANTS) -> List[dict]:
    """Every kernel in float32 against float64, judged by the yardsticks (docstring, 2.)."""
    checks = []
    for variant in variants:
        d = dictionary(dims)
        batch = make_batch(d, dims, device)
        fairseq_base, _ = build(dims, "materialized", "sum", "cpu", qk_scale=variant.qk_scale,
                                activation=variant.activation, paths="none")
        ref_out, ref_grads, _ = _measure(fairseq_base, "materialized", device, torch.float64, batch)
        out, grads, _ = _measure(fairseq_base, "materialized", device, torch.float32, batch)
        fairseq = _short(distance(out, grads, ref_out, ref_grads))
        checks.append(dict(name=f"fairseq attention (paths none) float32 vs float64 ({variant.name})",
                           status="reported", reason="yardstick", kernel="none", mode=None, model=variant.name,
                           qk_scale=variant.qk_scale, activation=variant.activation,
                           output_relative=fairseq["output"], max_relative=fairseq["gradient"],
                           worst_tensor=fairseq["worst_tensor"]))
        for mode in variant.modes:
            base, _ = build(dims, "materialized", mode, "cpu", qk_scale=variant.qk_scale,
                            activation=variant.activation)
            ref_out, ref_grads, ref_acts = _measure(base, "materialized", device, torch.float64, batch, True)
            measured = {}
            kernels = measured_kernels(device)
            failed = {}
            for kernel in ("materialized",) + kernels:
                result, failed[kernel] = _measure_by_name(base, kernel, device, torch.float32, batch, True)
                if result is None:
                    continue
                out, grads, acts = result
                dist = distance(out, grads, ref_out, ref_grads)
                relu = variant.activation == "relu"
                dist["relu_flip_units"] = relu_flip_units(acts, ref_acts) if relu else None
                dist["relu_flips"] = flip_count(dist["relu_flip_units"]) if relu else None
                measured[kernel] = (dist, grads)
            mat, mat_grads = measured["materialized"]
            yardsticks = {"materialized": _short(mat), "fairseq": fairseq}
            checks.append(dict(name=f"materialized float32 vs float64 ({variant.name}, {mode})", status="reported",
                               reason="yardstick", kernel="materialized", mode=mode, model=variant.name,
                               qk_scale=variant.qk_scale, activation=variant.activation,
                               relu_flips=mat["relu_flips"],
                               **{k: v for k, v in mat.items() if k not in ("relu_flips", "relu_flip_units")}))
            for kernel in kernels:
                if failed[kernel]:
                    checks.append(dict(name=f"{kernel} float32 vs float64 ({variant.name}, {mode})", status="failed",
                                       reason=f"it did not run here: {failed[kernel]}", kernel=kernel, mode=mode,
                                       model=variant.name, qk_scale=variant.qk_scale, activation=variant.activation))
                    log(f"exactness: {checks[-1]['name']}: failed ({checks[-1]['reason']})")
                    continue
                dist, grads = measured[kernel]
                flips, units = dist.pop("relu_flips"), dist.pop("relu_flip_units")
                # units known: only an fc1 tensor's own-layer flips explain (0 for any other tensor)
                own = ((own_flips_in_layer(units, mat["relu_flip_units"], dist["worst_tensor"]) or 0)
                       if units is not None else None)
                c = judge(kernel, mode, variant, dist, yardsticks, flips, mat["relu_flips"], own)
                vs = compare_gradients(grads, mat_grads, tolerance=None)
                c["vs_materialized"] = dict(max_relative=vs["max_relative"], worst_tensor=vs["worst_tensor"])
                log(f"exactness: {c['name']}: {c['status']}, output {c['output_relative']:.1e}, worst gradient "
                    f"{c['max_relative']:.1e} (limits {c['limit_output']:.1e} / {c['limit_gradient']:.1e}; "
                    f"materialized {mat['output_relative']:.1e} / {mat['max_relative']:.1e}, fairseq "
                    f"{fairseq['output']:.1e} / {fairseq['gradient']:.1e})")
                checks.append(c)
    return checks


def one_relu_flip(device, dims, variant=VARIANTS[1], mode="sum") -> dict:
    """What one ReLU flip does, in float64 (no rounding): the unit whose pre-activation is
    nearest zero is put on the other side, and the output and gradients are compared with
    the unflipped model. Also how many units lie within ``1e-6`` / ``1e-5`` of zero (where
    float32 rounding can flip them). The H100's plain-model numbers (``bias`` / ``fused``
    1.5e-4 from float64, worst tensor an ``fc1.weight``, output unchanged) are what one flip
    gives at the quick check's size on the CPU (``results/gpu/h100-2026-11-27/summary.md``)."""
    base, d = build(dims, "materialized", mode, "cpu", qk_scale=variant.qk_scale, activation=variant.activation)
    batch = make_batch(d, dims, device)
    ref_out, ref_grads, ref_acts = _measure(base, "materialized", device, torch.float64, batch, True)
    values = torch.cat([a.flatten().abs() for a in ref_acts.values()])
    name = min(ref_acts, key=lambda n: float(ref_acts[n].abs().min()))
    index = int(ref_acts[name].abs().flatten().argmin())
    model = with_kernel(base, "materialized", device, torch.float64)

    def flip(module, inputs, out):
        out = out.clone()
        out.view(-1)[index] = -out.view(-1)[index]
        return out

    dict(model.named_modules())[name].register_forward_hook(flip)
    out, grads = forward_backward(model, batch)
    dist = distance(out, grads, ref_out, ref_grads)
    return dict(units=values.numel(), within_1e6=int((values < 1e-6).sum()), within_1e5=int((values < 1e-5).sum()),
                flipped=name, pre_activation=float(ref_acts[name].flatten()[index]),
                output_relative=dist["output_relative"], max_relative=dist["max_relative"],
                worst_tensor=dist["worst_tensor"])


def _bias_takes_float64(device) -> bool:
    """Whether the ``bias`` kernel's SDPA backend runs float64 with a mask gradient here."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from realformer_nmt.modules.residual_attention import sdpa_probe

    q = torch.randn(1, 1, 8, 16, device=device, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(1, 1, 8, 8, device=device, dtype=torch.float64, requires_grad=True)
    try:
        with sdpa_kernel(sdpa_probe.mask_grad_backends(torch.device(device))):
            F.scaled_dot_product_attention(q, q, q, attn_mask=bias).sum().backward()
    except RuntimeError:
        return False
    return True


def float64_proof(device, dims, log=print, variant=VARIANTS[0]) -> List[dict]:
    """Each kernel against materialized, both in float64 (docstring, 1.)."""
    checks = []
    d = dictionary(dims)
    batch = make_batch(d, dims, device)
    bias_float64 = _bias_takes_float64(device)
    for mode in variant.modes:
        base, _ = build(dims, "materialized", mode, "cpu", qk_scale=variant.qk_scale, activation=variant.activation)
        ref_out, ref_grads, _ = _measure(base, "materialized", device, torch.float64, batch)
        for kernel in KERNELS:
            name = f"{kernel} float64 vs materialized float64 ({variant.name}, {mode})"
            try:
                out, grads, _ = _measure(base, kernel, device, torch.float64, batch)
            except RuntimeError as exc:
                checks.append(dict(name=name, status="reported", kernel=kernel, mode=mode,
                                   reason=f"does not run in float64 on {device}: {str(exc).splitlines()[0][:200]}"))
                continue
            dist = distance(out, grads, ref_out, ref_grads)
            worst = max(dist["output_relative"], dist["max_relative"] or 0.0)
            problems = list(dist.pop("problems"))
            if worst > FLOAT64_TOLERANCE:
                problems.insert(0, f"output {dist['output_relative']:.2e}, worst gradient {dist['max_relative']:.2e} "
                                   f"({dist['worst_tensor']}) > {FLOAT64_TOLERANCE:g}")
            status, reason = ("failed", "; ".join(problems[:5])) if problems else ("passed", None)
            if not bias_float64 and kernel in ("bias", "auto") and status == "passed":
                status, reason = "reported", (f"the bias kernel's SDPA backend on {device} has no float64: its calls "
                                              "ran materialized (the CPU proof covers bias)")
            log(f"exactness: {name}: {status}, output {dist['output_relative']:.1e}, worst gradient "
                f"{dist['max_relative']:.1e}")
            checks.append(dict(name=name, status=status, reason=reason, kernel=kernel, mode=mode,
                               model=variant.name, tolerance=FLOAT64_TOLERANCE, **dist))
    return checks


def precision_distances(device, dims, log=print, variants=VARIANTS[:2]) -> List[dict]:
    """float16 and bfloat16 distances to float64 per kernel and for fairseq's own attention
    (reported: the numeric cost of half precision, beside fairseq's)."""
    checks = []
    for variant in variants:
        d = dictionary(dims)
        batch = make_batch(d, dims, device)
        fairseq_base, _ = build(dims, "materialized", "sum", "cpu", qk_scale=variant.qk_scale,
                                activation=variant.activation, paths="none")
        fs_ref = _measure(fairseq_base, "materialized", device, torch.float64, batch)
        for mode in variant.modes:
            base, _ = build(dims, "materialized", mode, "cpu", qk_scale=variant.qk_scale,
                            activation=variant.activation)
            ref_out, ref_grads, _ = _measure(base, "materialized", device, torch.float64, batch)
            for dtype in HALF_DTYPES:
                table = {}
                for kernel in ("materialized",) + measured_kernels(device):
                    result, _ = _measure_by_name(base, kernel, device, dtype, batch)
                    if result is None:  # its failure is the float32 check's to report
                        continue
                    out, grads, _ = result
                    table[kernel] = dict(_short(distance(out, grads, ref_out, ref_grads)),
                                         finite=bool(torch.isfinite(out).all()))
                out, grads, _ = _measure(fairseq_base, "materialized", device, dtype, batch)
                table["fairseq"] = dict(_short(distance(out, grads, fs_ref[0], fs_ref[1])),
                                        finite=bool(torch.isfinite(out).all()))
                dtype_name = str(dtype).replace("torch.", "")
                ratio = max(t["output"] for k, t in table.items() if k != "fairseq") / max(table["fairseq"]["output"],
                                                                                          1e-30)
                checks.append(dict(name=f"{dtype_name} vs float64 ({variant.name}, {mode})", status="reported",
                                   reason=f"measured, not judged: the kernels' output at most {ratio:.1f}x "
                                          "fairseq's attention's distance", dtype=dtype_name, mode=mode,
                                   model=variant.name, distances=table))
                log(f"exactness: {checks[-1]['name']}: " + ", ".join(
                    f"{k} {v['output']:.1e}/{v['gradient']:.1e}" for k, v in table.items()))
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


@contextlib.contextmanager
def true_float32():
    """float32 means float32 on Ampere and later (no TF32 matmuls), restored after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def run(device, dims, log=print, deadline=None) -> List[dict]:
    """Every part above; with ``deadline`` (a ``time.time()``), a part that would start after
    it is not run and says so (failed when it is judged, skipped when only reported)."""
    import time

    parts = [
        ("the float64 proof", True, lambda: float64_proof(device, dims, log)),
        *[(f"float32 vs float64 ({v.name})", True, lambda v=v: model_agreement(device, dims, log, variants=(v,)))
          for v in VARIANTS],
        ("the bias layer's mask gradient", True, lambda: [mask_gradient(device, dims)]),
        ("the bias layer's SDPA backend", True, lambda: [check_backends(sdpa_backends(device, dims), device)]),
        ("half-precision distances", False, lambda: precision_distances(device, dims, log)),
    ]
    checks = []
    with true_float32():
        for what, judged, part in parts:
            if deadline is not None and time.time() > deadline:
                checks.append(dict(name=f"exactness: {what}", status="failed" if judged else "skipped",
                                   reason="not run: the section's reserved time was spent"))
                continue
            found = part()
            if len(found) == 1:
                c = found[0]
                log(f"exactness: {c['name']}: {c['status']}" + (f" ({c['reason']})" if c["reason"] else ""))
            checks += found
    return checks
