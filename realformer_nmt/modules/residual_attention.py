"""RealFormer's residual attention, as one extension of fairseq's MultiheadAttention.

Layer n of a path adds its raw scores to the running sum handed over by the previous
layer of the path and attends with the softmax of that sum (He et al., 2021, eq. 3)::

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1}          [B, H, T, S]
    P_n = softmax(mask(A_n / c_n)),  c_n = 1 (sum) or n (mean)
    out = P_n V_n

``n`` counts the layers whose scores are in the sum: a layer skipped by layerdrop adds
nothing and is not counted, so training with layerdrop, a pruned model
(``--*-layers-to-keep``) and the full model all compute the paper's running mean.

The *unmasked* running sum ``A_n`` is what goes on to the next layer, as in the official
reference (google-research ``realformer/realformer.py``): masks are applied after the
residual is added, never accumulated.

Everything RealFormer-specific about attention lives in this file: the sum/mean rule,
where masks go, the dtype of the running sum, and the choice of kernel.

Kernels (``--residual-attention-kernel``); all compute the same function:

* ``materialized``: the running sum is a ``[B, H, T, S]`` float32 tensor handed from layer
  to layer (fp16/bf16 logits are summed in float32: 48 layers of fp16 logits overflow);
  the softmax is formed explicitly, so its ``T x S`` probabilities are stored for backward.
* ``bias``: layer n calls PyTorch's ``scaled_dot_product_attention`` (SDPA) with the
  previous layers' sum as an additive mask, ``softmax(q k^T / c_n + B_n) v`` with
  ``B_n = A_{n-1} / c_n + mask``, and hands ``A_n = A_{n-1} + Q_n K_n^T / sqrt(d)`` on,
  formed with one float32 ``baddbmm`` only when the next layer asks for it (the last layer
  of a path never does). When the mask needs a gradient (training), the SDPA call is
  restricted (``torch.nn.attention.sdpa_kernel``) to a backend that returns it: on CUDA
  only the memory-efficient kernel (cuDNN attention returns no mask gradient), so per layer
  one ``T x S`` bias in the input dtype is stored instead of the float32 sum plus
  probabilities; the running sum itself stays float32. If that backend refuses a call,
  the call runs ``materialized`` (logged once), never a kernel that loses the gradient. On
  CPU, SDPA's math kernel runs such a call (same function, materialized's cost).
* ``fused``: since ``A_n = sum_i Q_i K_i^T / sqrt(d) = [Q_1 .. Q_n] [K_1 .. K_n]^T / sqrt(d)``,
  the path carries the projected queries and keys of its layers (``[B, H, T, d]`` and
  ``[B, H, S, d]`` each) and layer n is one call of SDPA on them side by side (query/key
  head dim ``n*d``): no ``T x S`` score or probability tensor is ever stored. The sum over
  layers is part of the kernel's dot product, accumulated in float32 by SDPA's fused
  kernels (flash / memory-efficient) whatever the input dtype. For n > 1 the call is
  recomputed in backward (``torch.utils.checkpoint``) instead of keeping its
  ``n*d``-wide inputs, so what a path stores grows with its depth as one ``[B, H, T, d]``
  query and key per layer, the tensors the projections produce anyway. On CPU,
  PyTorch's fused kernel needs equal query and value head dims, so values are
  zero-padded to ``n*d`` there (their extra output columns are zeros and dropped).
* ``auto`` (default): per layer and call, :func:`auto_kernel` (the rule and the
  measurements behind it are written there).

Calls that need ``T x S`` tensors anyway use ``materialized`` whatever the setting:
cached decoding (one query row per step: only that row of scores flows between layers,
which is cheap) and calls that return attention weights (``--print-alignment``, analysis).
A path can go from fused to materialized or bias (``A_n = Q K^T`` is formed once), never
back.

Query rows that see no real key (every key they may attend to is padding: the first rows
of a left-padded target under the causal mask) attend uniformly to the padded keys they may
see, in every kernel; their output is a constant of the scores, so no kernel sends a
gradient from them to the queries, keys or earlier layers' scores (SDPA would, through an
additive mask that only rounds the scores away: those rows are recomputed from detached
scores where they occur).
"""

import contextlib
import json
import logging
import os
import threading
from functools import lru_cache
from typing import Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import MultiheadAttention
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .dropout_names import use_fairseq_dropout_names

RESIDUAL_MODES = ("sum", "mean")
KERNELS = ("auto", "materialized", "fused", "bias")

logger = logging.getLogger(__name__)

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class ResidualState(NamedTuple):
    """What one layer of a residual path hands to the same module of the next layer.

    The running sum is ``A_n = scores + sum_i queries[i] @ keys[i]^T``:

    * ``scores``: a ``[B, H, T, S]`` float32 part of it, or None (materialized: all of
      ``A_n``; bias: ``A_{n-1}``; in cached decoding only the current step's rows, ``T = 1``);
    * ``queries``, ``keys``: terms not yet multiplied out, the projected queries (scaled by
      ``1/sqrt(d)``) and keys of layers, one ``[B, H, T, d]`` / ``[B, H, S, d]`` tensor per
      layer (fused: every layer's; bias: this layer's).

    ``terms``: ``n``, the number of layers whose scores are in the sum (the divisor
    ``c_n`` of mean mode).
    """

    scores: Optional[Tensor] = None
    queries: Tuple[Tensor, ...] = ()
    keys: Tuple[Tensor, ...] = ()
    terms: int = 0

    @classmethod
    def of_scores(cls, scores: Tensor, terms: int = 1) -> "ResidualState":
        """A materialized state: ``scores`` is the running sum of ``terms`` layers."""
        return cls(scores=scores, terms=terms)

    @property
    def fused(self) -> bool:
        """Whether the sum is still factored into queries and keys (what ``fused`` needs)."""
        return self.scores is None

    def running_sum(self) -> Tensor:
        """``A_n`` as a float32 ``[B, H, T, S]`` tensor, whichever kernel produced it (also
        under autocast, which would otherwise run these products in half precision)."""
        device = (self.scores if self.scores is not None else self.queries[0]).device
        with torch.autocast(device_type=device.type, enabled=False):
            if self.scores is None:
                q = torch.cat(self.queries, dim=-1).float()
                k = torch.cat(self.keys, dim=-1).float()
                return torch.matmul(q, k.transpose(-1, -2))
            total = self.scores
            for q, k in zip(self.queries, self.keys):
                bsz, heads, tgt_len, dim = q.shape
                total = torch.baddbmm(
                    total.reshape(bsz * heads, tgt_len, -1),
                    q.float().reshape(bsz * heads, tgt_len, dim),
                    k.float().reshape(bsz * heads, -1, dim).transpose(1, 2),
                ).view(bsz, heads, tgt_len, -1)
            return total



class MaskFacts(NamedTuple):
    """What the SDPA kernels branch on about the masks of a path, for one forward.

    Every layer of a path sees the same masks, so whoever builds them (the decoder, for
    its self-attention path) establishes these once per forward with :meth:`of` (at most
    one read of tensor values on the host) and hands them to every layer; a module given
    none establishes them itself, per call.

    * ``causal``: ``attn_mask`` is fairseq's future mask (0 on and below the diagonal,
      -inf above) and every row of ``key_padding_mask`` is real keys, then padding (or
      there is no padding): SDPA's ``is_causal`` computes it (see ``_sdpa_mask``);
    * ``shortest``: the fewest real keys of a row of ``key_padding_mask`` (None: no
      padding mask, or not read);
    * ``dead_rows``: ``[B, 1, T, 1]``, True at query rows that see no real key (every key
      they may attend to is padded), or None where no row does.
    """

    causal: bool = False
    shortest: Optional[int] = None
    dead_rows: Optional[Tensor] = None

    @classmethod
    def of(cls, key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]) -> "MaskFacts":
        """The facts of ``key_padding_mask`` (``[B, S]``, True at padded keys) and
        ``attn_mask`` (additive ``[T, S]``), with one host read at most (``tolist``).

        Nothing is read with padding alone (no ``attn_mask``): a row then sees no real key
        only if its whole sentence is padding, which fairseq's batches never hold (not
        checked). Nor under ``torch.compile``, where a read is a graph break: the general
        mask runs and the rows without a real key are replaced wherever they are (a
        ``torch.where`` that finds none changes nothing)."""
        if attn_mask is None:
            return cls()
        pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
        dead = None
        if pad is not None:  # [B, T]: no key both real and allowed by attn_mask
            dead = ~(~pad[:, None, :] & ~torch.isneginf(attn_mask)[None]).any(dim=-1)
        if torch.compiler.is_compiling():
            return cls(dead_rows=None if dead is None else dead[:, None, :, None])
        checks = []  # 0-dim integer tensors, read together
        square = attn_mask.dim() == 2 and attn_mask.size(0) == attn_mask.size(1)
        if square:
            future = torch.ones(attn_mask.shape, dtype=torch.bool, device=attn_mask.device).triu(1)
            checks.append(torch.isneginf(attn_mask).eq(future).all() & attn_mask.masked_fill(future, 0).eq(0).all())
        if pad is not None:
            checks += [(pad[:, 1:] | ~pad[:, :-1]).all(),  # right padding: real keys, then padding
                       (~pad).sum(-1).min(), dead.any()]
        values = torch.stack([c.long() for c in checks]).tolist()  # the one host read
        causal = bool(values[0]) if square else False
        if pad is None:
            return cls(causal=causal)
        right_padded, shortest, any_dead = values[-3:]
        return cls(causal=causal and bool(right_padded), shortest=int(shortest),
                   dead_rows=dead[:, None, :, None] if any_dead else None)

def auto_kernel(*, device: torch.device, training_dropout: bool, terms: int) -> str:
    """The kernel ``auto`` runs for layer ``terms`` of a path on a full (uncached) pass.

    On CPU: the first layer of a path runs ``fused`` (that call is PyTorch's own fused
    attention with query/key head dim ``d``; the next layer forms ``A_1 = Q_1 K_1^T`` once
    when it adds its scores), every later layer ``materialized``; with attention dropout
    active, ``materialized`` throughout.

    Why, measured on this project's 2-core CPU (``python scripts/benchmark_kernels.py``,
    attention alone, 6 layers, B=8, H=8, d=64, float32, forward + backward; table in
    ``results/kernel_timing_cpu.json``): ``fused`` for every layer costs 1.4-1.8x
    ``materialized`` at every length from 32 to 512, causal or not: its dot products grow
    with the layer number (query/key head dim ``n*d``; on CPU also the zero-padded values)
    and it recomputes its call in backward. ``fused`` for the first layer only was never
    slower than ``materialized`` beyond noise (0.84x-1.01x its time), and it stores one layer's
    ``T x S`` probabilities fewer. PyTorch's fused CPU kernel has no dropout (SDPA falls
    back to its unfused math kernel), hence materialized there. ``bias`` on CPU runs SDPA's
    math kernel (a mask with a gradient), no better than ``materialized``.

    On CUDA: the rule measured by the GPU check (``results/gpu/kernel_rule.json``, written
    by ``python -m realformer_nmt.experiments.gpu_check --steps speed`` and shipped in the
    wheel; a user's own rule overrides it, see ``kernel_rule_source``),
    ``{"rule": {"first_layer": K, "later_layers": K}}``.
    Until a GPU has measured it: ``bias`` for every layer (it stores no probabilities and
    adds no QK work; ``fused`` grows its QK work with depth). ``bias`` is replaced by
    ``materialized`` if no fused SDPA backend of this GPU takes a float mask with a gradient
    (then SDPA would store the probabilities anyway). The rule applied is logged once.
    """
    if device.type != "cuda":
        if training_dropout:
            return "materialized"
        return "fused" if terms <= FUSED_MAX_TERMS else "materialized"
    rule = cuda_kernel_rule()
    kernel = rule["first_layer"] if terms == 1 else rule["later_layers"]
    if kernel == "bias" and not bias_has_fused_backend(device):
        kernel = "materialized"
    return kernel


# Layers of a path (counted from its first) that ``auto`` runs fused on CPU (see ``auto_kernel``).
FUSED_MAX_TERMS = 1
KERNEL_RULE_ENV = "REALFORMER_KERNEL_RULE"
DEFAULT_CUDA_RULE = {"first_layer": "bias", "later_layers": "bias"}


# The project's measured rule: in a wheel, next to this module (setup.py copies the committed
# results/gpu/kernel_rule.json there when it builds); in a checkout, results/gpu/ itself.
PACKAGED_KERNEL_RULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_rule.json")
CHECKOUT_KERNEL_RULE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "results", "gpu", "kernel_rule.json")


def user_kernel_rule_path() -> str:
    """The per-user rule, ``$XDG_CACHE_HOME/realformer_nmt/kernel_rule.json`` (default
    ``~/.cache/realformer_nmt/kernel_rule.json``): where the GPU check copies what it measured."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "realformer_nmt", "kernel_rule.json")


def kernel_rule_source() -> Tuple[str, str]:
    """``(path, which)`` of the CUDA rule ``auto`` reads, the first of: the file named by
    ``REALFORMER_KERNEL_RULE`` (even if missing: then the default); the user's own rule
    (``user_kernel_rule_path()``); the project's rule shipped in the package; a checkout's
    ``results/gpu/kernel_rule.json``. None there: the default (``bias`` for every layer)."""
    if os.environ.get(KERNEL_RULE_ENV):
        return os.environ[KERNEL_RULE_ENV], KERNEL_RULE_ENV
    for path, which in ((user_kernel_rule_path(), "the user's rule"), (PACKAGED_KERNEL_RULE, "the packaged rule"),
                        (CHECKOUT_KERNEL_RULE, "the checkout's rule")):
        if os.path.isfile(path):
            return path, which
    return PACKAGED_KERNEL_RULE, "no rule file"


@lru_cache(maxsize=None)
def _read_kernel_rule(path: str) -> Tuple[Dict[str, str], str]:
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return dict(DEFAULT_CUDA_RULE), "no measured rule (bias for every layer until the GPU check measures one)"
    except (OSError, ValueError) as exc:
        return dict(DEFAULT_CUDA_RULE), f"unreadable kernel rule {path} ({exc}); bias for every layer"
    rule = record.get("rule", {}) if isinstance(record, dict) else {}
    picked = {}
    for position in ("first_layer", "later_layers"):
        kernel = rule.get(position)
        picked[position] = kernel if kernel in ("materialized", "fused", "bias") else DEFAULT_CUDA_RULE[position]
    where = record.get("device", "a GPU") if isinstance(record, dict) else "a GPU"
    return picked, f"rule measured on {where} ({path})"


_LOGGED_RULES = set()


def cuda_kernel_rule() -> Dict[str, str]:
    """``{"first_layer": kernel, "later_layers": kernel}`` for ``auto`` on CUDA (logged once)."""
    path, which = kernel_rule_source()
    rule, origin = _read_kernel_rule(path)
    if path not in _LOGGED_RULES:
        _LOGGED_RULES.add(path)
        logger.info("residual attention kernel 'auto' on CUDA: first layer of a path %s, later layers %s (%s; %s)",
                    rule["first_layer"], rule["later_layers"], origin, which)
    return rule


def mask_grad_backends(device: torch.device):
    """The SDPA backends the ``bias`` kernel may run on when its mask needs a gradient.

    CUDA: only the memory-efficient kernel. It returns the gradient of a float mask;
    cuDNN attention, which PyTorch tries first on Hopper GPUs, returns only dq, dk, dv
    (no mask gradient) and has open NaN reports for float masks whose rows see no real key.
    CPU: only the math kernel (the one CPU backend that takes a float mask with a
    gradient; exact, materialized's cost, as the module docstring says)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else [SDPBackend.MATH]


def _in_a_clean_thread(fn, *args):
    """``fn(*args)`` in a new thread: grad mode, inference mode, autocast and saved-tensor
    hooks (``torch.utils.checkpoint``) are thread-local, so the caller's context (a
    ``torch.no_grad()`` decoding, a checkpointed layer) cannot change the answer."""
    result, error = [], []

    def target():
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)

    thread = threading.Thread(target=target, name="realformer-sdpa-probe")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _probe_once(device: str) -> bool:
    from torch.nn.attention import sdpa_kernel

    with torch.enable_grad():
        q = torch.randn(1, 1, 8, 16, device=device, dtype=torch.float16, requires_grad=True)
        bias = torch.zeros(1, 1, 8, 8, device=device, dtype=torch.float16, requires_grad=True)
        with sdpa_kernel(mask_grad_backends(torch.device(device))):
            F.scaled_dot_product_attention(q, q, q, attn_mask=bias).sum().backward()
    return bias.grad is not None


@lru_cache(maxsize=None)
def _bias_backend_probe(device: str) -> bool:
    """Whether the backend of :func:`mask_grad_backends` takes a float mask with a gradient
    on ``device``, forward and backward. Probed in a thread of its own, so the answer does
    not depend on where the first call comes from (under ``torch.no_grad()`` in
    fairseq-generate, inside a checkpointed layer): it is cached for the process."""
    try:
        ok = _in_a_clean_thread(_probe_once, device)
    except Exception as exc:  # noqa: BLE001 - no such backend, or no CUDA at all: either way not usable
        logger.info("SDPA probe on %s: %s", device, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        ok = False
    if not ok:
        logger.warning("SDPA's memory-efficient backend on %s does not take a float mask with a gradient: "
                       "'auto' uses materialized instead of bias there", device)
    return ok


def bias_has_fused_backend(device: torch.device) -> bool:
    """Whether SDPA's memory-efficient backend (not the math kernel) takes a float mask that
    needs a gradient on this CUDA device, forward and backward (probed once per device)."""
    if device.type != "cuda":
        return False
    if device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())  # the probe's thread has its own
    return _bias_backend_probe(str(device))


_LOGGED_FALLBACKS = set()


def _log_bias_fallback_once(device: torch.device, exc: Exception) -> None:
    key = str(device)
    if key not in _LOGGED_FALLBACKS:
        _LOGGED_FALLBACKS.add(key)
        logger.warning("bias kernel on %s: SDPA's %s backend refused a call whose mask needs a gradient (%s); "
                       "such calls run materialized (logged once)", device,
                       "/".join(b.name for b in mask_grad_backends(device)), str(exc).splitlines()[0])


def _is_no_kernel_error(exc: RuntimeError) -> bool:
    message = str(exc)
    return "No available kernel" in message or "No viable backend" in message


class ResidualMultiheadAttention(MultiheadAttention):
    """fairseq ``MultiheadAttention`` that threads RealFormer's residual scores.

    Parameters and incremental-state buffers are fairseq's own (``q_proj``,
    ``k_proj``, ``v_proj``, ``out_proj``; ``prev_key``/``prev_value``), so vanilla
    transformer checkpoints load unchanged.

    Args (beyond fairseq's):
        residual: this module is on a residual path: it adds the previous layer's
            running sum and returns its own. Off, it is exactly fairseq's module (same
            kernels, fused where fairseq fuses) and returns a ``None`` state.
        mode: ``"sum"`` or ``"mean"`` (divide the sum by the number of layers in it
            before the softmax; the undivided sum is still what is passed on).
        kernel: ``"auto"``, ``"materialized"`` or ``"fused"`` (see the module docstring).
    """

    def __init__(self, *args, residual: bool = False, mode: str = "sum", kernel: str = "auto", **kwargs):
        super().__init__(*args, **kwargs)
        if mode not in RESIDUAL_MODES:
            raise ValueError(f"residual attention mode must be one of {RESIDUAL_MODES}, got {mode!r}")
        if kernel not in KERNELS:
            raise ValueError(f"residual attention kernel must be one of {KERNELS}, got {kernel!r}")
        if residual and (self.bias_k is not None or self.add_zero_attn or self.use_xformers):
            # These change the key set per layer, so scores would not line up across layers.
            raise ValueError("residual attention does not support add_bias_kv, add_zero_attn or xformers")
        self.residual = residual
        self.mode = mode
        self.kernel = kernel
        # Analysis only (experiments/attention_analysis.py): with ``need_own_weights`` set, a
        # call that returns weights (materialized) also leaves this layer's own probabilities
        # softmax(mask(Q_n K_n^T / sqrt(d))), [H, B, T, S], in ``own_weights``.
        self.need_own_weights = False
        self.own_weights: Optional[Tensor] = None
        use_fairseq_dropout_names(self, "MultiheadAttention")

    def extra_repr(self) -> str:
        if not self.residual:
            return "residual=False"
        return f"residual=True, mode={self.mode}, kernel={self.kernel}"

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        need_head_weights: bool = False,
        prev_state: Optional[ResidualState] = None,
        mask_facts: Optional[MaskFacts] = None,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[ResidualState]]:
        """Input ``T x B x C`` as in fairseq; returns ``(output, weights, state)``.

        Args:
            key_padding_mask: ``[B, S]``, True at padded keys. It covers *all*
                keys, cached ones included, also in incremental decoding.
            attn_mask: additive ``[T, S]`` mask (e.g. the causal mask).
            prev_state: the previous layer's :class:`ResidualState` on this path
                (``None`` for the first layer). In cached decoding its scores are the
                current step's rows only.
            mask_facts: the :class:`MaskFacts` of ``key_padding_mask`` and ``attn_mask``,
                established once per forward by whoever built them (the fused and bias
                kernels branch on them); None: established here when a kernel needs them.

        Returns:
            output ``[T, B, C]``; weights as fairseq's (``[B, T, S]`` averaged over
            heads, or ``[H, B, T, S]`` with ``need_head_weights``; ``None`` unless
            requested); this layer's :class:`ResidualState` (``None`` when the module is
            not on a residual path).
        """
        if not self.residual:
            if prev_state is not None:
                raise ValueError("prev_state given to an attention module that is not on a residual path")
            if incremental_state is not None and key_padding_mask is not None and not static_kv:
                # fairseq's cache wants only the new keys' mask; it appends the rest itself.
                new_keys = query.size(0) if key is None or self.self_attention else key.size(0)
                key_padding_mask = key_padding_mask[:, -new_keys:]
            output, weights = super().forward(
                query, key, value, key_padding_mask=key_padding_mask,
                incremental_state=incremental_state, need_weights=need_weights,
                static_kv=static_kv, attn_mask=attn_mask, need_head_weights=need_head_weights,
            )
            return output, weights, None
        need_weights = need_weights or need_head_weights
        kernel = self.kernel_for(query, key, incremental_state, need_weights, prev_state)
        if kernel in ("fused", "bias"):
            facts = mask_facts if mask_facts is not None else MaskFacts.of(key_padding_mask, attn_mask)
            run = self._fused_forward if kernel == "fused" else self._bias_forward
            return run(query, key, value, key_padding_mask, attn_mask, prev_state, facts)
        return self._materialized_forward(
            query, key, value, key_padding_mask, incremental_state,
            need_weights, static_kv, attn_mask, need_head_weights, prev_state,
        )

    def kernel_for(self, query: Tensor, key: Optional[Tensor], incremental_state, need_weights: bool,
                   prev_state: Optional[ResidualState]) -> str:
        """The kernel this call runs (``materialized``, ``fused`` or ``bias``)."""
        if incremental_state is not None or need_weights:
            return "materialized"  # one row per step / weights wanted: T x S exists anyway
        kernel = self.kernel
        if kernel == "auto":
            kernel = auto_kernel(
                device=query.device, training_dropout=self._dropout_p() > 0,
                terms=(prev_state.terms if prev_state is not None else 0) + 1,
            )
        if kernel == "fused" and prev_state is not None and not prev_state.fused:
            # a multiplied-out sum cannot be split into Q and K again
            return "bias" if bias_has_fused_backend(query.device) else "materialized"
        return kernel

    def _dropout_p(self) -> float:
        dropout = self.dropout_module
        return dropout.p if (self.training or dropout.apply_during_inference) else 0.0

    def _divisor(self, terms: int) -> float:
        return float(terms) if self.mode == "mean" else 1.0

    # ----------------------------------------------------------------------------------
    # materialized: the B x H x T x S float32 running sum
    # ----------------------------------------------------------------------------------

    def _materialized_forward(
        self, query, key, value, key_padding_mask, incremental_state,
        need_weights, static_kv, attn_mask, need_head_weights, prev_state,
    ):
        tgt_len, bsz, _ = query.size()
        # fairseq's projections, key/value cache and beam sharing, stopped before its
        # masks and softmax. Any state dict (even a throwaway empty one) keeps fairseq
        # off PyTorch's fused kernel, which cannot return scores.
        logits, v = super().forward(
            query, key, value, key_padding_mask=None,
            incremental_state=incremental_state if incremental_state is not None else {},
            need_weights=False, static_kv=static_kv, attn_mask=None, before_softmax=True,
        )
        src_len = logits.size(-1)
        # The running sum is kept in float32: 48 layers of fp16 logits can overflow.
        scores = logits.view(bsz, self.num_heads, tgt_len, src_len).float()
        terms = 1
        own = scores.clone() if self.need_own_weights else None  # before the residual is added in place
        if prev_state is not None:
            prev = prev_state.running_sum()
            if prev.shape != scores.shape:
                raise ValueError(
                    f"the previous layer's scores have shape {tuple(prev.shape)}, expected "
                    f"{tuple(scores.shape)} (batch x heads x tgt_len x src_len of this layer)"
                )
            # in place: these fresh logits are not needed by autograd (bmm keeps q and k)
            scores = scores.add_(prev)
            terms += prev_state.terms
        probs = self._masked_softmax(scores, key_padding_mask, attn_mask, self._divisor(terms))
        if own is not None:  # the same masks, no running sum, no divisor
            self.own_weights = self._masked_softmax(own, key_padding_mask, attn_mask, 1.0).detach().transpose(1, 0)
        output = self._attend(probs.type_as(v), v, tgt_len, bsz)

        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs.transpose(1, 0)  # [H, B, T, S], as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return output, weights, ResidualState(scores=scores, terms=terms)

    def _masked_softmax(self, scores: Tensor, key_padding_mask: Optional[Tensor],
                        attn_mask: Optional[Tensor], divisor: float) -> Tensor:
        """softmax(mask(A_n / c_n)) in float32. Padded keys get the most negative
        finite value, so a row with every key padded is uniform, not NaN."""
        # ``scores`` is passed on unmasked: the first op makes a copy, later ones work in it
        logits = scores
        if divisor != 1.0:
            logits = logits / divisor
        if attn_mask is not None:
            mask = attn_mask.to(logits.dtype)
            logits = logits + mask if logits is scores else logits.add_(mask)
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool)[:, None, None, :]
            fill = logits.masked_fill if logits is scores else logits.masked_fill_
            logits = fill(pad, torch.finfo(logits.dtype).min)
        return utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)

    def _attend(self, probs: Tensor, v: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """Dropout, ``P V`` and the output projection; ``probs`` is ``[B, H, T, S]``."""
        probs = self.dropout_module(probs)
        kv_bsz = v.size(0) // self.num_heads
        if kv_bsz != bsz:
            # Beam search shares one encoder copy per sentence (fairseq's set_beam_size).
            attn = torch.einsum(
                "bxhts,bhsd->bxhtd",
                probs.view((kv_bsz, -1) + probs.shape[1:]),
                v.view(kv_bsz, self.num_heads, -1, self.head_dim),
            )
        else:
            attn = torch.matmul(probs, v.view(bsz, self.num_heads, -1, self.head_dim))
        return self._project_out(attn, tgt_len, bsz)

    def _project_out(self, attn: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """``[B, H, T, D]`` -> ``[T, B, H * D]`` -> ``out_proj``."""
        attn = attn.reshape(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
        return self.out_proj(attn.reshape(tgt_len, bsz, self.embed_dim))

    # ----------------------------------------------------------------------------------
    # fused: concatenated queries and keys through scaled_dot_product_attention
    # ----------------------------------------------------------------------------------

    def _fused_forward(self, query, key, value, key_padding_mask, attn_mask, prev_state, facts: MaskFacts):
        tgt_len, bsz, _ = query.size()
        q, k, v = self._project(query, key, value)  # [B, H, T|S, d]; q scaled by 1/sqrt(d)
        queries, keys = (q,), (k,)
        if prev_state is not None:
            if prev_state.keys[0].shape != k.shape or prev_state.queries[0].shape != q.shape:
                raise ValueError(
                    f"the previous layer's queries/keys have shapes {tuple(prev_state.queries[0].shape)}"
                    f"/{tuple(prev_state.keys[0].shape)}, expected {tuple(q.shape)}/{tuple(k.shape)} "
                    "(batch x heads x length x head dim of this layer)"
                )
            queries, keys = prev_state.queries + queries, prev_state.keys + keys
        terms = len(queries)
        mask, causal, padded_keys = _sdpa_mask(key_padding_mask, attn_mask, q.dtype, tgt_len, k.size(2), facts)
        args = (mask, causal, padded_keys, facts.shortest, self._dropout_p(), 1.0 / self._divisor(terms), terms)
        if terms > 1 and torch.is_grad_enabled():
            # recomputed in backward: autograd keeps the per-layer q/k, never their n*d-wide concatenation
            out = checkpoint(_stacked_attention, *args, *queries, *keys, v, use_reentrant=False)
        else:
            out = _stacked_attention(*args, *queries, *keys, v)
        out = self._uniform_rows_without_real_keys(out, v, key_padding_mask, facts)
        output = self._project_out(out, tgt_len, bsz)
        return output, None, ResidualState(queries=queries, keys=keys, terms=terms)

    def _uniform_rows_without_real_keys(self, out: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                                        facts: MaskFacts) -> Tensor:
        """SDPA's ``out`` with the rows that see no real key replaced by what the
        materialized kernel computes there: the uniform average of the values of the
        padded keys, a constant of the scores. (SDPA's own forward rounds to that, but its
        backward recomputes those probabilities from a log-sum-exp that the mask's huge
        value swallows, and sends gradients through the scores.)"""
        dead = facts.dead_rows  # [B, 1, T, 1]
        if dead is None or key_padding_mask is None:
            return out
        if dead.size(0) != out.size(0) or dead.size(2) != out.size(2):
            raise ValueError(f"mask_facts.dead_rows has shape {tuple(dead.shape)}, expected "
                             f"({out.size(0)}, 1, {out.size(2)}, 1) (batch x 1 x tgt_len x 1 of this call)")
        weights = dead & key_padding_mask.to(torch.bool)[:, None, None, :]  # [B, 1, T, S]
        weights = weights.to(v.dtype)
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=1)
        weights = F.dropout(weights, p=self._dropout_p(), training=self._dropout_p() > 0)
        return torch.where(dead, torch.matmul(weights, v), out)

    # ----------------------------------------------------------------------------------
    # bias: the previous layers' sum as SDPA's additive mask
    # ----------------------------------------------------------------------------------

    def _bias_forward(self, query, key, value, key_padding_mask, attn_mask, prev_state, facts: MaskFacts):
        if prev_state is None:  # nothing to add yet: the first layer is fused's (plain SDPA)
            return self._fused_forward(query, key, value, key_padding_mask, attn_mask, None, facts)
        tgt_len, bsz, _ = query.size()
        q, k, v = self._project(query, key, value)  # [B, H, T|S, d]; q scaled by 1/sqrt(d)
        prev = prev_state.running_sum()  # A_{n-1}, float32 (one baddbmm after a bias layer)
        expected = (bsz, self.num_heads, tgt_len, k.size(2))
        if tuple(prev.shape) != expected:
            raise ValueError(f"the previous layer's scores have shape {tuple(prev.shape)}, expected {expected} "
                             "(batch x heads x tgt_len x src_len of this layer)")
        terms = prev_state.terms + 1
        divisor = self._divisor(terms)
        bias = _additive_bias(prev, divisor, key_padding_mask, attn_mask, q.dtype)
        # a mask that needs a gradient: only a backend that returns it (see mask_grad_backends)
        restricted = bias.requires_grad
        if restricted:
            from torch.nn.attention import sdpa_kernel
        try:
            with sdpa_kernel(mask_grad_backends(q.device)) if restricted else contextlib.nullcontext():
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self._dropout_p(),
                                                     scale=1.0 / divisor)
        except RuntimeError as exc:
            if not (restricted and _is_no_kernel_error(exc)):
                raise
            _log_bias_fallback_once(q.device, exc)
            return self._materialized_forward(query, key, value, key_padding_mask, None, False, False,
                                              attn_mask, False, prev_state)
        out = self._uniform_rows_without_real_keys(out, v, key_padding_mask, facts)
        output = self._project_out(out, tgt_len, bsz)
        # A_n = A_{n-1} + q k^T is formed by the next layer that asks for it
        return output, None, ResidualState(scores=prev, queries=(q,), keys=(k,), terms=terms)

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]):
        """fairseq's q/k/v projections for a full pass, as ``[B, H, T, d]`` tensors."""
        q = self.q_proj(query) * self.scaling
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key
        k, v = self.k_proj(key), self.v_proj(value)
        return self._heads(q), self._heads(k), self._heads(v)

    def _heads(self, x: Tensor) -> Tensor:
        length, bsz, _ = x.size()
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)


def _stacked_attention(mask: Optional[Tensor], causal: bool, padded_keys: Optional[Tensor],
                       shortest: Optional[int], dropout_p: float, scale: float, terms: int, *tensors: Tensor):
    """``softmax(scale * [q_1..q_n] [k_1..k_n]^T + mask) v`` with SDPA; ``tensors`` are
    ``q_1..q_n, k_1..k_n, v``. Returns ``[B, H, T, d]``.

    ``padded_keys`` ([B, S], right padding, the shortest row ``shortest`` real keys long;
    only with ``causal``): SDPA's causal kernel
    lets a padded query row see the padded keys up to its own position, which the
    materialized kernel masks. Nothing downstream reads those rows, but every kernel gives
    the same tensor: the rows from the shortest sentence's end on are attended again,
    non-causally over the real keys (what the materialized kernel computes for a padded
    query), and the padded ones taken from there. Cost: ``T - min(length)`` extra rows."""
    q = torch.cat(tensors[:terms], dim=-1) if terms > 1 else tensors[0]
    k = torch.cat(tensors[terms:2 * terms], dim=-1) if terms > 1 else tensors[terms]
    v = _pad_values(tensors[-1], q.size(-1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         dropout_p=dropout_p, scale=scale)  # q carries 1/sqrt(d)
    if padded_keys is not None:
        first = shortest  # the shortest sentence's length (established with the masks: no host read)
        key_mask = torch.zeros(padded_keys.shape, dtype=q.dtype, device=q.device).masked_fill(
            padded_keys, torch.finfo(q.dtype).min)[:, None, None, :]
        tail = F.scaled_dot_product_attention(q[:, :, first:], k, v, attn_mask=key_mask,
                                              dropout_p=dropout_p, scale=scale)
        padded_rows = padded_keys[:, None, first:, None]  # self-attention: query i is key i
        out = torch.cat([out[:, :, :first], torch.where(padded_rows, tail, out[:, :, first:])], dim=2)
    return out[..., : tensors[-1].size(-1)]


def _pad_values(v: Tensor, qk_dim: int) -> Tensor:
    """Zero-pad ``v`` to the query/key head dim where PyTorch's fused kernel needs it.

    PyTorch's CPU flash kernel takes only equal query and value head dims (otherwise SDPA
    falls back to its math kernel, which stores the ``T x S`` probabilities); the extra
    output columns are zeros and are dropped. CUDA kernels take unequal dims as they are.
    """
    extra = qk_dim - v.size(-1)
    if extra == 0 or v.device.type == "cuda":
        return v
    return F.pad(v, (0, extra))


def _sdpa_mask(key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], dtype: torch.dtype,
               tgt_len: int, src_len: int, facts: "MaskFacts") -> Tuple[Optional[Tensor], bool, Optional[Tensor]]:
    """``(attn_mask, is_causal, padded_keys)`` for SDPA, with the materialized kernel's
    semantics at every position.

    Padded keys get the most negative finite value (a fully padded row is uniform, as in
    ``_masked_softmax``); ``attn_mask`` is added as it is. No ``T x S`` tensor is built
    where it can be avoided: ``[B, 1, 1, S]`` for padding alone; ``[T, S]`` for a mask
    alone; fairseq's causal mask with right-padded keys (its target batches;
    ``facts.causal``) is SDPA's ``is_causal`` without any mask: padded keys then come after
    every real query's position, so only the rows of padded queries see them, and those
    rows are redone from the returned ``padded_keys`` (see ``_stacked_attention``).
    Otherwise (left-padded targets, ``--cross-self-attention``) one ``[B, 1, T, S]`` mask.
    """
    if facts.causal and attn_mask is not None and attn_mask.shape == (tgt_len, src_len):
        padded = key_padding_mask is not None and facts.shortest is not None and facts.shortest < src_len
        return None, True, (key_padding_mask.to(torch.bool) if padded else None)
    mask: Optional[Tensor] = None
    if attn_mask is not None:
        mask = attn_mask.to(dtype)
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool)[:, None, None, :]
        if mask is None:
            mask = torch.zeros(pad.shape, dtype=dtype, device=pad.device)
        else:
            mask = mask.expand(pad.size(0), 1, tgt_len, src_len)
        mask = mask.masked_fill(pad, torch.finfo(dtype).min)
    return mask, False, None


def _additive_bias(prev: Tensor, divisor: float, key_padding_mask: Optional[Tensor],
                   attn_mask: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``B_n = A_{n-1} / c_n + mask`` in the input dtype, ``[B, H, T, S]``: ``attn_mask`` is
    added, padded keys are *replaced* by the dtype's most negative finite value (as the
    materialized kernel does: a row whose keys are all padded is uniform, not NaN)."""
    if divisor != 1.0:
        bias = prev / divisor
        if attn_mask is not None:
            bias.add_(attn_mask.to(bias.dtype))
    elif attn_mask is not None:
        bias = prev + attn_mask.to(prev.dtype)
    else:
        bias = prev.clone() if key_padding_mask is not None else prev  # never written into A_{n-1}
    if key_padding_mask is not None:
        bias.masked_fill_(key_padding_mask.to(torch.bool)[:, None, None, :], torch.finfo(dtype).min)
    return bias.to(dtype)
