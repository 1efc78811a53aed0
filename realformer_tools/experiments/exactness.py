"""Exactness of every kernel on a device, judged without counting ReLU flips (the device
run's ``exactness`` section; its dry run on the CPU, in CI).

Models: a ``realformer_transformer`` with every path on (encoder, decoder, cross), in training
mode without dropout, one batch (left-padded sources, padded targets), the same weights for
every kernel. Three variants (:data:`VARIANTS`): the *peaked* model (every ``q_proj`` /
``k_proj`` weight x3, so that the residual scores matter), sum and mean; the *plain* model,
sum; and the plain model with GELU instead of ReLU, sum.

**The judge**: each kernel in float32 against a float64 reference of the same model
(``materialized`` in float64), **with float64's ReLU masks forced on both**: the on/off
pattern of every FFN unit is taken from the float64 run and every FFN of the float32 run
applies it (``x * mask`` instead of ``relu(x)``; on the float64 run that is ReLU itself).
Without forcing, a unit whose pre-activation lies within float32 rounding of zero may be on
in one run and off in the other; its whole contribution then enters or leaves that layer's
``fc1`` / ``fc2`` gradients. One such unit (``encoder.layers.4.fc1``, pre-activation -1.6e-6)
gave the 2.1e-3 of ``triton`` on one H100, reproduced to four digits on the CPU, where the
roles reversed (``materialized`` flipped two units, ``triton`` none); sixteen single flips of
near-zero units give 1.1e-4 to 3.7e-3. Which kernel flips is rounding luck, so a flip count
cannot judge a kernel; with the masks forced the same model measured 4.19e-5 for
``materialized`` and 4.20e-5 for ``triton``.

Distances are the output's relative error and the worst parameter tensor's. A kernel passes
when both are at most ``2 x`` the larger of two yardsticks measured in the same run + 1e-6:
``materialized``'s own forced distance and fairseq's own attention's
(``--residual-attention-paths none``, the same weights, its own float64 masks forced). Why
yardsticks and not a fixed tolerance: two float32 algorithms for one function differ by its
conditioning times float32's rounding (~3e-4 on the peaked sum model on CUDA for every
implementation, fairseq's included). The factor 2 allows for different summation orders of
equally accurate algorithms (measured 0.67-1.4x materialized's).

The **GELU twin** (no unit switches on or off) is a second judge, unforced. The **flips** are
reported as a fact beside each judged row: the units whose ReLU state in the unforced float32
run differs from float64's, and the unforced distance. **Half precision** (reported): the
forced distances in float16 and bfloat16 of every kernel and of fairseq's own attention.

Structural problems fail a kernel whatever the distances: a parameter without gradient, a
``k_proj.bias`` gradient (exactly zero in theory) above ``FLOOR`` times the largest tensor's,
a ``q_proj`` / ``k_proj`` weight whose reference gradient is below that floor (a lost path
would not show).
"""

import argparse
import contextlib
import copy
import dataclasses
import re
import time
import types
from typing import Dict, List, Optional, Tuple

import torch

FLOOR = 1e-4
YARDSTICK_FACTOR = 2.0
YARDSTICK_SLACK = 1e-6
HALF_DTYPES = (torch.float16, torch.bfloat16)


def measured_kernels(device) -> Tuple[str, ...]:
    """The kernels judged on ``device``: ``bias``, and ``triton`` where it applies (on CUDA;
    on the CPU only under Triton's interpreter)."""
    from realformer_nmt.modules.residual_attention import triton_kernel

    try:
        applies = triton_kernel.unsupported(torch.device(device), torch.float32) is None
    except Exception:  # a triton that fails here: judged as not applying, its tests say why
        applies = False
    return ("bias", "triton") if applies else ("bias",)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    qk_scale: float
    activation: str
    modes: Tuple[str, ...]


VARIANTS = (
    Variant("peaked", 3.0, "relu", ("sum", "mean")),
    Variant("plain", 1.0, "relu", ("sum",)),
    Variant("plain-gelu", 1.0, "gelu", ("sum",)),
)


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


def compare_gradients(grads, ref, tolerance: Optional[float] = None) -> dict:
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


def _short(d: dict) -> dict:
    return dict(output=d["output_relative"], gradient=d["max_relative"], worst_tensor=d["worst_tensor"])


@contextlib.contextmanager
def forced_relu(model, masks):
    """Every FFN of ``model`` applies ``masks`` (``{"<layer>.fc1": bool tensor}``, the float64
    run's ReLU pattern) instead of ReLU: ``x * mask``. Restored on exit."""
    saved = []
    for name, module in model.named_modules():
        mask = (masks or {}).get(f"{name}.fc1")
        if mask is not None and hasattr(module, "activation_fn"):
            saved.append((module, module.activation_fn))
            module.activation_fn = lambda x, mask=mask: x * mask.to(device=x.device, dtype=x.dtype)
    try:
        yield
    finally:
        for module, fn in saved:
            module.activation_fn = fn


def measure(base, kernel, device, dtype, batch, masks=None, hooks=()):
    """``(output, gradients, fc1 outputs)`` of ``base`` run with ``kernel`` in ``dtype``,
    with ``masks`` forced (:func:`forced_relu`); ``hooks``: ``(module name, forward hook)``
    pairs put on the copy (a test flips a unit with one)."""
    model = with_kernel(base, kernel, device, dtype)
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(hook) for name, hook in hooks]
    acts = {}
    try:
        with forced_relu(model, masks):
            out, grads = forward_backward(model, batch, acts)
    finally:
        for h in handles:
            h.remove()
    return out, grads, acts


def masks_of(acts, activation):
    """The float64 run's ReLU pattern per ``fc1`` (None for a GELU model: nothing to force)."""
    return {n: a > 0 for n, a in acts.items()} if activation == "relu" else None


def flips(acts, ref_acts) -> dict:
    """The units whose ReLU state differs from float64's: how many, and the nearest to zero."""
    found = []
    for name, ref in ref_acts.items():
        where = torch.nonzero(((acts[name] > 0) != (ref > 0)).flatten()).flatten().tolist()
        found += [(abs(float(ref.flatten()[i])), name, i) for i in where]
    found.sort()
    return dict(count=len(found), units=[dict(module=n, index=i, float64_pre_activation=float(v))
                                         for v, n, i in found[:5]])


def limits(yardsticks: Dict[str, dict]) -> Tuple[float, float]:
    """``(output limit, gradient limit)``: 2x the larger yardstick plus 1e-6."""
    out = max(y["output"] for y in yardsticks.values())
    grad = max(y["gradient"] for y in yardsticks.values())
    return YARDSTICK_FACTOR * out + YARDSTICK_SLACK, YARDSTICK_FACTOR * grad + YARDSTICK_SLACK


def judge(name, d: dict, yardsticks: Dict[str, dict]) -> dict:
    """Passed when the forced distance ``d`` is within the yardsticks' limits and nothing
    structural is wrong; flips are never part of the verdict."""
    limit_out, limit_grad = limits(yardsticks)
    problems = list(d["problems"])
    if d["output_relative"] > limit_out:
        problems.append(f"output {d['output_relative']:.2e} from float64 > {limit_out:.2e}")
    if d["max_relative"] is not None and d["max_relative"] > limit_grad:
        problems.append(f"worst gradient {d['max_relative']:.2e} from float64 ({d['worst_tensor']}) > {limit_grad:.2e}")
    return dict(name=name, status="failed" if problems else "passed", reason="; ".join(problems[:5]) or None,
                limit_output=limit_out, limit_gradient=limit_grad, yardsticks=yardsticks,
                **{k: v for k, v in d.items() if k != "problems"}, problems=problems)


def _run_or_error(fn, kernel):
    """``(fn(), None)``, or ``(None, error)`` where ``triton`` failed to compile or launch
    here (one failed check, not a stopped section); any other kernel's error is raised."""
    try:
        return fn(), None
    except Exception as error:
        if kernel != "triton":
            raise
        return None, f"{type(error).__name__}: {error}"[:300]


def agreement(device, dims, variant, mode, log=print, hooks=None, prepare=None) -> List[dict]:
    """One model and mode: the yardsticks, then each kernel judged forced, with its flips and
    unforced distance reported beside. For tests: ``hooks`` (``{kernel: [(module, hook)]}``,
    on that kernel's float32 runs) and ``prepare`` (called on the residual model's weights)."""
    hooks = {} if hooks is None else hooks
    d = dictionary(dims)
    batch = make_batch(d, dims, device)
    kw = dict(qk_scale=variant.qk_scale, activation=variant.activation)
    yardsticks, rows = {}, []
    for who, paths in (("fairseq", "none"), ("materialized", None)):
        base, _ = build(dims, "materialized", mode, "cpu", paths=paths, **kw)
        if prepare is not None and paths is None:
            prepare(base, batch)
        ref_out, ref_grads, ref_acts = measure(base, "materialized", device, torch.float64, batch)
        masks = masks_of(ref_acts, variant.activation)
        out, grads, _ = measure(base, "materialized", device, torch.float32, batch, masks, hooks.get(who, ()))
        yardsticks[who] = _short(distance(out, grads, ref_out, ref_grads))
    where = f"({variant.name}, {mode})"
    for kernel in ("materialized",) + measured_kernels(device):
        name = f"{kernel} float32 vs float64 {where}"

        def both(kernel=kernel):
            forced = measure(base, kernel, device, torch.float32, batch, masks, hooks.get(kernel, ()))
            free = measure(base, kernel, device, torch.float32, batch, None, hooks.get(kernel, ()))
            return forced, free

        result, error = _run_or_error(both, kernel)
        if error:
            rows.append(dict(name=name, status="failed", reason=f"it did not run here: {error}", kernel=kernel))
            continue
        (out, grads, _), (free_out, free_grads, free_acts) = result
        dist = distance(out, grads, ref_out, ref_grads)
        c = judge(name, dist, yardsticks) if kernel != "materialized" else dict(
            name=name, status="reported", reason="yardstick", **{k: v for k, v in dist.items() if k != "problems"})
        c.update(kernel=kernel, mode=mode, model=variant.name, activation=variant.activation,
                 forced=masks is not None, unforced=_short(distance(free_out, free_grads, ref_out, ref_grads)),
                 relu_flips=flips(free_acts, ref_acts) if masks is not None else None)
        rows.append(c)
        flipped = "" if c["relu_flips"] is None else f"; unforced: {c['relu_flips']['count']} flips, worst gradient " \
                                                      f"{c['unforced']['gradient']:.1e}"
        log(f"exactness: {name}: {c['status']}, output {c['output_relative']:.1e}, worst gradient "
            f"{c['max_relative']:.1e}{flipped}")
    fairseq = yardsticks["fairseq"]
    rows.insert(0, dict(name=f"fairseq attention float32 vs float64 {where}", status="reported", reason="yardstick",
                        kernel="fairseq", mode=mode, model=variant.name, output_relative=fairseq["output"],
                        max_relative=fairseq["gradient"], worst_tensor=fairseq["worst_tensor"]))
    return rows


def precision_distances(device, dims, variant=VARIANTS[0], mode="sum", log=print) -> List[dict]:
    """float16 and bfloat16 distances to float64 (masks forced) per kernel and for fairseq's
    own attention: reported, the numeric cost of half precision beside fairseq's."""
    d = dictionary(dims)
    batch = make_batch(d, dims, device)
    refs = {}
    for who, paths in (("fairseq", "none"), ("residual", None)):
        base, _ = build(dims, "materialized", mode, "cpu", paths=paths, qk_scale=variant.qk_scale,
                        activation=variant.activation)
        out, grads, acts = measure(base, "materialized", device, torch.float64, batch)
        refs[who] = (base, out, grads, masks_of(acts, variant.activation))
    checks = []
    for dtype in HALF_DTYPES:
        table = {}
        for kernel in ("fairseq", "materialized") + measured_kernels(device):
            base, ref_out, ref_grads, masks = refs["fairseq" if kernel == "fairseq" else "residual"]
            run = "materialized" if kernel == "fairseq" else kernel
            result, _ = _run_or_error(lambda b=base, r=run, t=dtype, m=masks: measure(b, r, device, t, batch, m),
                                      kernel)
            if result is not None:
                table[kernel] = dict(_short(distance(result[0], result[1], ref_out, ref_grads)),
                                     finite=bool(torch.isfinite(result[0]).all()))
        name = str(dtype).replace("torch.", "")
        checks.append(dict(name=f"{name} vs float64 ({variant.name}, {mode}, masks forced)", status="reported",
                           reason="measured, not judged", dtype=name, model=variant.name, mode=mode, distances=table))
        log(f"exactness: {checks[-1]['name']}: " + ", ".join(f"{k} {v['output']:.1e}/{v['gradient']:.1e}"
                                                              for k, v in table.items()))
    return checks




def run(device, dims, log=print, deadline=None) -> List[dict]:
    """Every model and mode, then the half-precision distances; with ``deadline`` (a
    ``time.time()``) a part that would start after it is not run and says so."""
    parts = [(f"float32 vs float64 ({v.name}, {m})", True, lambda v=v, m=m: agreement(device, dims, v, m, log))
             for v in VARIANTS for m in v.modes]
    parts.append(("half-precision distances", False, lambda: precision_distances(device, dims, log=log)))
    checks = []
    with true_float32():
        for what, judged, part in parts:
            if deadline is not None and time.time() > deadline:
                checks.append(dict(name=f"exactness: {what}", status="failed" if judged else "skipped",
                                   reason="not run: the section's deadline had passed"))
                continue
            checks += part()
    return checks
