"""Attention analysis in the style of the paper's Figs 4-8: per (layer, head), the
distribution over real query tokens of the attention entropy, and of the Jensen-Shannon
divergence between head i of layer L and head i of layer L-1.

The probabilities are the model's own: forward hooks on every attention module
(fairseq's ``MultiheadAttention`` and its subclass ``ResidualMultiheadAttention``) ask
the module for per-head weights and read them from its return value, so whatever the
module computes in training (residual sum or mean, masks, kernel choice, falling back
to the materialized path when weights are requested) is what is measured. Nothing here
recomputes attention.

Shapes: ``[B, H, T, S]`` = batch, heads, queries, keys. All logarithms are natural:
entropy lies in ``[0, ln S]``, JSD in ``[0, ln 2]``.

Control (``own_scores``): a RealFormer layer n > 1 attends with the softmax of the running
sum ``A_n = A_{n-1} + S_n`` (``S_n = Q_n K_n^T / sqrt(d)``), so its attention contains the
layers below by construction, and adjacent layers look alike (and sums of logits look
sharper) whatever was learned. Beside the attention each layer uses, the same statistics
are computed on the layer's own scores, ``softmax(mask(S_n))`` with the layer's masks
(``ResidualMultiheadAttention.need_own_weights``). For fairseq's own module (Post-LN,
Pre-LN, a path set to ``none``) and RealFormer's first layer of a path, own scores are the
attention used; ``max_abs_difference_from_used`` records per layer how far they differ.

Statistics are streamed into fixed-width histograms (``BIN_WIDTH`` nats), so memory
does not grow with the number of sentences; medians and quartiles read from them are
within one bin width of the exact ones (exact min and max are kept too).
"""

import contextlib
import functools
import hashlib
import inspect
import io
import json
import math
import os
import re
import textwrap
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..errors import CheckpointFileError, ConfigError, DataError
from . import fairseq_runs

ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")
STATISTICS = ("entropy", "jsd")
BIN_WIDTH = 1e-3  # nats; the error bound of every median and quartile written
QUARTILES = (0.25, 0.5, 0.75)
LN2 = math.log(2.0)

# The paper's colour code (Figs 4-8): a head's median above the upper threshold is red,
# below the lower one blue, otherwise yellow.
THRESHOLDS = {"entropy": (1.5, 4.5), "jsd": (0.25, 0.75)}
COLOURS = {"blue": "#4a7cc9", "yellow": "#f2c230", "red": "#d9473b"}

Log = Callable[[str], None]


# --------------------------------------------------------------------------- formulas

def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy (nats) over the last dim, with 0 ln 0 = 0; computed in float64."""
    p = probs.double()
    return torch.special.entr(p).sum(-1)


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence (nats) over the last dim: H((p+q)/2) - (H(p)+H(q))/2,
    clipped to its range ``[0, ln 2]`` against rounding."""
    p, q = p.double(), q.double()
    jsd = entropy((p + q) / 2) - (entropy(p) + entropy(q)) / 2
    return jsd.clamp_(0.0, LN2)


CHUNK_ELEMENTS = 1 << 22  # float64 work space per step: 32 MiB


class LayerStream:
    """The statistics of one attention type on one batch, fed one layer at a time (as
    the forward pass produces them), holding only the previous layer's rows.

    ``query_real`` / ``key_real``: ``[B, T]`` / ``[B, S]``, True at real (non-padding)
    tokens. Padded queries are dropped; each real query's distribution is restricted to
    the real keys (padded keys zeroed, the row renormalized); ``padding_mass`` is the
    largest mass the model itself put on padded keys of a real query (0 when masking is
    right). Values are computed in float64, in chunks of rows.
    """

    def __init__(self, query_real: Tensor, key_real: Tensor):
        self.rows = query_real
        b, t = query_real.nonzero(as_tuple=True)
        self.keys = key_real[b]  # [N, S]: the real keys of each real query
        self.prev: Optional[Tensor] = None
        self.layers = 0
        self.padding_mass = 0.0

    @property
    def tokens(self) -> int:
        return self.keys.size(0)

    def add(self, weights: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        """``weights``: ``[H, B, T, S]`` of the next layer. Returns ``(entropy [H, N],
        jsd to the previous layer [H, N] or None)``, float64."""
        x = weights.detach()[:, self.rows].float()  # [H, N, S], real queries only
        keys = self.keys.to(x.device)
        if x.size(1):
            self.padding_mass = max(self.padding_mass, float(x.masked_fill(keys, 0).sum(-1).max()))
        x = x.masked_fill_(~keys, 0)
        x = x.div_(x.sum(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny))
        step = max(1, CHUNK_ELEMENTS // max(1, x.size(0) * x.size(2)))
        ent = torch.cat([entropy(x[:, i:i + step]) for i in range(0, x.size(1), step)] or
                        [x.new_zeros(x.size(0), 0, dtype=torch.float64)], 1)
        jsd = None
        if self.prev is not None:
            jsd = torch.cat([js_divergence(x[:, i:i + step], self.prev[:, i:i + step])
                             for i in range(0, x.size(1), step)] or
                            [x.new_zeros(x.size(0), 0, dtype=torch.float64)], 1)
        self.prev = x
        self.layers += 1
        return ent, jsd


def token_statistics(
    probs: Sequence[Tensor], query_real: Tensor, key_real: Tensor
) -> Tuple[Tensor, Tensor, float]:
    """Per-token values of one attention type on one batch, all layers at once.

    Args:
        probs: one ``[B, H, T, S]`` tensor per layer (layer 1 first).
        query_real / key_real: as in :class:`LayerStream`.

    Returns ``(entropies [L, H, N], jsd [L-1, H, N], padding_mass)``; N = real query tokens
    of the batch, in batch-then-position order.
    """
    stream = LayerStream(query_real, key_real)
    ents, jsds = [], []
    for p in probs:
        ent, jsd = stream.add(p.transpose(0, 1))
        ents.append(ent.cpu())
        if jsd is not None:
            jsds.append(jsd.cpu())
    heads = probs[0].size(1)
    jsd = torch.stack(jsds) if jsds else torch.zeros(0, heads, stream.tokens, dtype=torch.float64)
    return torch.stack(ents), jsd, stream.padding_mass


# --------------------------------------------------------------------------- histograms

class Histogram:
    """Counts of non-negative values in bins of ``bin_width`` from 0 up, one row per
    series (a series is one (layer, head)), growing as larger values arrive. Exact count,
    min, max, sum and sum of squares are kept beside the bins."""

    def __init__(self, n_series: int, bin_width: float = BIN_WIDTH):
        self.bin_width = bin_width
        self.counts = np.zeros((n_series, 0), np.int64)
        self.min = np.full(n_series, np.inf)
        self.max = np.full(n_series, -np.inf)
        self.sum = np.zeros(n_series)
        self.sumsq = np.zeros(n_series)

    @property
    def n_series(self) -> int:
        return self.counts.shape[0]

    def total(self) -> np.ndarray:
        return self.counts.sum(1)

    def add(self, values) -> None:
        """``values``: ``[n_series, N]`` (one row per series, same N)."""
        self.add_rows(slice(0, self.n_series), values)

    def add_rows(self, rows: slice, values) -> None:
        """``values``: ``[len(rows), N]`` for the series ``rows`` (a slice)."""
        first, stop, _ = rows.indices(self.n_series)
        v = np.asarray(values, dtype=np.float64).reshape(stop - first, -1)
        if v.shape[1] == 0:
            return
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError("histogram values must be finite and non-negative")
        idx = np.floor(v / self.bin_width).astype(np.int64)
        n_bins = max(self.counts.shape[1], int(idx.max()) + 1)
        if n_bins > self.counts.shape[1]:
            grown = np.zeros((self.n_series, n_bins), np.int64)
            grown[:, : self.counts.shape[1]] = self.counts
            self.counts = grown
        n = stop - first
        flat = idx + np.arange(n)[:, None] * n_bins
        self.counts[first:stop] += np.bincount(flat.ravel(), minlength=n * n_bins).reshape(n, n_bins)
        self.min[first:stop] = np.minimum(self.min[first:stop], v.min(1))
        self.max[first:stop] = np.maximum(self.max[first:stop], v.max(1))
        self.sum[first:stop] += v.sum(1)
        self.sumsq[first:stop] += (v * v).sum(1)

    def quantiles(self, qs: Sequence[float] = QUARTILES) -> np.ndarray:
        """``[n_series, len(qs)]``, NaN for an empty series. Defined as numpy's default
        (linear between the order statistics around ``q * (n - 1)``), with each order
        statistic placed inside its bin (spread evenly over it), so every value is within
        ``bin_width`` of ``np.quantile`` of the raw values."""
        out = np.full((self.n_series, len(qs)), np.nan)
        for s in range(self.n_series):
            n = int(self.counts[s].sum())
            if n == 0:
                continue
            cum = np.cumsum(self.counts[s])
            for j, q in enumerate(qs):
                pos = q * (n - 1)
                k = int(math.floor(pos))
                value = self._order_statistic(s, cum, k + 1)
                if pos > k:
                    value += (pos - k) * (self._order_statistic(s, cum, k + 2) - value)
                out[s, j] = value
        return out

    def _order_statistic(self, s: int, cum: np.ndarray, k: int) -> float:
        """Approximate k-th smallest value (1-based) of series ``s``: in its bin, exact
        at the extremes."""
        b = int(np.searchsorted(cum, k, side="left"))
        before = cum[b] - self.counts[s, b]
        value = (b + (k - before - 0.5) / self.counts[s, b]) * self.bin_width
        return min(max(value, self.min[s]), self.max[s])

    def median(self) -> np.ndarray:
        return self.quantiles((0.5,))[:, 0]

    def pooled(self, series: Sequence[int]) -> "Histogram":
        """One series holding the union of the given ones (e.g. all heads of a layer)."""
        h = Histogram(1, self.bin_width)
        rows = list(series)
        h.counts = self.counts[rows].sum(0, keepdims=True)
        h.min = self.min[rows].min(keepdims=True)
        h.max = self.max[rows].max(keepdims=True)
        h.sum = self.sum[rows].sum(keepdims=True)
        h.sumsq = self.sumsq[rows].sum(keepdims=True)
        return h

    def density(self, s: int, points: int = 100) -> Tuple[np.ndarray, np.ndarray]:
        """Gaussian kernel density of series ``s`` (Scott's bandwidth, as matplotlib's
        ``violinplot``), evaluated from the bins on ``points`` coordinates min..max."""
        n = self.counts[s].sum()
        lo, hi = self.min[s], self.max[s]
        if n == 0:
            return np.zeros(0), np.zeros(0)
        if hi - lo < self.bin_width:
            return np.array([lo, hi]), np.array([1.0, 1.0])
        nz = np.nonzero(self.counts[s])[0]
        centers = np.clip((nz + 0.5) * self.bin_width, lo, hi)
        weights = self.counts[s][nz].astype(np.float64)
        std = math.sqrt(max(self.sumsq[s] / n - (self.sum[s] / n) ** 2, 0.0))
        bw = max(std * n ** (-1 / 5), self.bin_width)
        coords = np.linspace(lo, hi, points)
        z = (coords[:, None] - centers[None, :]) / bw
        vals = (np.exp(-0.5 * z * z) * weights).sum(1) / (n * bw * math.sqrt(2 * math.pi))
        return coords, vals

    def state(self, prefix: str) -> Dict[str, np.ndarray]:
        return {f"{prefix}.{k}": getattr(self, k) for k in ("counts", "min", "max", "sum", "sumsq")}

    def load(self, arrays, prefix: str) -> None:
        for k in ("counts", "min", "max", "sum", "sumsq"):
            setattr(self, k, np.array(arrays[f"{prefix}.{k}"]))


@dataclass
class TypeStats:
    """Streaming statistics of one attention type: series index = layer * heads + head.

    ``entropy``/``jsd``: of the attention each layer uses; ``own_entropy``/``own_jsd``: of
    each layer's own scores (the control, see the module docstring); ``own_difference``:
    per layer, the largest ``|own - used|`` probability over real query tokens."""

    layers: int
    heads: int
    entropy: Histogram = None
    jsd: Histogram = None
    tokens: int = 0
    padding_mass: float = 0.0
    own_entropy: Histogram = None
    own_jsd: Histogram = None
    own_difference: np.ndarray = None

    def __post_init__(self):
        for name, rows in (("entropy", self.layers), ("jsd", max(self.layers - 1, 0))):
            for attr in (name, f"own_{name}"):
                if getattr(self, attr) is None:
                    setattr(self, attr, Histogram(rows * self.heads))
        if self.own_difference is None:
            self.own_difference = np.zeros(self.layers)

    def histogram(self, statistic: str, source: str = "used") -> Histogram:
        """``statistic`` in STATISTICS; ``source``: ``used`` (the attention the layer
        attends with) or ``own`` (its own scores)."""
        return getattr(self, statistic if source == "used" else f"own_{statistic}")

    def begin_batch(self, query_real: Tensor, key_real: Tensor) -> None:
        self._stream = LayerStream(query_real, key_real)
        self._own_stream = LayerStream(query_real, key_real)
        # (layer, {source: (entropy [H, N], jsd [H, N] or None)}, |own - used| max), kept until end_batch
        self._pending = []

    def add_layer(self, layer: int, weights: Tensor, own: Optional[Tensor] = None) -> None:
        """One layer's weights ``[H, B, T, S]`` (layers arrive in order) and the
        probabilities of its own scores (same shape; None: the weights are its own)."""
        stream = self._stream
        if layer != stream.layers:
            raise RuntimeError(f"attention layer {layer + 1} ran after layer {stream.layers}; expected in order")
        own = weights if own is None else own
        if own.shape != weights.shape:
            raise RuntimeError(f"attention layer {layer + 1}: own-score probabilities of shape "
                               f"{tuple(own.shape)}, weights {tuple(weights.shape)}")
        values = {}
        for source, s, w in (("used", stream, weights), ("own", self._own_stream, own)):
            ent, jsd = s.add(w)
            values[source] = (ent.cpu().numpy(), None if jsd is None else jsd.cpu().numpy())
        difference = 0.0
        if own is not weights and stream.tokens:
            per_row = (weights.detach().float() - own.detach().float()).abs().amax(dim=(0, 3))  # [B, T]
            difference = float(per_row[stream.rows.to(per_row.device)].max())
        self._pending.append((layer, values, difference))

    def end_batch(self) -> None:
        """Fold the batch into the histograms: all of it or, if interrupted before, none."""
        stream, pending = self._stream, self._pending
        own_stream = self._own_stream
        self._stream, self._own_stream, self._pending = None, None, []
        if stream.layers != self.layers or own_stream.layers != self.layers:
            raise RuntimeError(f"{stream.layers} of {self.layers} attention layers ran in the forward pass")
        for layer, values, difference in pending:
            for source, (ent, jsd) in values.items():
                self.histogram("entropy", source).add_rows(slice(layer * self.heads, (layer + 1) * self.heads), ent)
                if jsd is not None:
                    self.histogram("jsd", source).add_rows(slice((layer - 1) * self.heads, layer * self.heads), jsd)
            self.own_difference[layer] = max(self.own_difference[layer], difference)
        self.tokens += stream.tokens
        self.padding_mass = max(self.padding_mass, stream.padding_mass, own_stream.padding_mass)

    def add(self, probs: Sequence[Tensor], query_real: Tensor, key_real: Tensor,
            own_probs: Optional[Sequence[Tensor]] = None) -> None:
        """One batch, all layers at once (``[B, H, T, S]`` per layer; ``own_probs``: of
        the layers' own scores, None when they are the weights)."""
        self.begin_batch(query_real, key_real)
        for layer, p in enumerate(probs):
            own = None if own_probs is None else own_probs[layer].transpose(0, 1)
            self.add_layer(layer, p.transpose(0, 1), own)
        self.end_batch()

    def grid(self, statistic: str, values: np.ndarray) -> List[List]:
        """Per-series values -> ``[[per head] per layer (or adjacent pair)]``."""
        rows = self.layers if statistic == "entropy" else max(self.layers - 1, 0)
        return values.reshape(rows, self.heads, *values.shape[1:]).tolist()

    def to_json(self) -> Dict[str, list]:
        """``<stat>_median``: ``[[per head] per layer]`` (JSD: per adjacent pair, the
        first row being layers 1-2); ``<stat>_quartiles``: ``[q1, median, q3]`` per head;
        all of the attention the layers use. ``own_scores``: the same keys for the
        layers' own scores, and ``max_abs_difference_from_used`` per layer."""
        def statistics(source):
            out = {}
            for stat in STATISTICS:
                q = np.round(self.histogram(stat, source).quantiles(QUARTILES), 6)
                out[f"{stat}_median"] = _none_for_nan(self.grid(stat, q[:, 1]))
                out[f"{stat}_quartiles"] = _none_for_nan(self.grid(stat, q))
            return out

        out = statistics("used")
        out["own_scores"] = statistics("own")
        out["own_scores"]["max_abs_difference_from_used"] = [round(float(x), 6) for x in self.own_difference]
        return out


def _none_for_nan(obj):
    """JSON has no NaN: an empty series (no tokens) becomes null."""
    if isinstance(obj, list):
        return [_none_for_nan(x) for x in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


# --------------------------------------------------------------------------- the model's attention

def attention_modules(model) -> Dict[str, list]:
    """The model's attention modules by type, in layer order, chosen by model type:
    encoder-decoder models (``transformer``, ``realformer_transformer*``) have
    ``encoder_self``, ``decoder_self`` and ``cross``; encoder-only models (RoBERTa and
    its subclasses, e.g. ``realformer_bert*``) have ``encoder_self`` only."""
    from fairseq.models import FairseqEncoderDecoderModel, FairseqEncoderModel
    from fairseq.modules import MultiheadAttention

    def collect(module):
        return [m for m in module.modules() if isinstance(m, MultiheadAttention)]

    if isinstance(model, FairseqEncoderDecoderModel):
        decoder = collect(model.decoder)
        found = {
            "encoder_self": collect(model.encoder),
            "decoder_self": [m for m in decoder if not m.encoder_decoder_attention],
            "cross": [m for m in decoder if m.encoder_decoder_attention],
        }
    elif isinstance(model, FairseqEncoderModel):
        found = {"encoder_self": collect(model.encoder)}
    else:
        raise ConfigError(
            f"--path: attention analysis supports encoder-decoder and encoder-only models, "
            f"not {type(model).__name__}"
        )
    found = {t: ms for t, ms in found.items() if ms}
    for t, ms in found.items():
        heads = {m.num_heads for m in ms}
        if len(heads) != 1:
            raise ConfigError(f"--path: {t} layers have different head counts {sorted(heads)}; "
                              "adjacent-layer JSD pairs head i with head i")
    return found


def _as_keyword_arguments(module, args, kwargs) -> dict:
    """A call's arguments, positional ones included, as keywords of ``module.forward``."""
    if not args:
        return dict(kwargs)
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    out = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"{type(module).__name__}.forward takes *args; cannot request weights by keyword")
        else:
            out[name] = value
    return out


def _request_head_weights(module, args, kwargs):
    """Pre-hook: ask for per-head weights ``[H, B, T, S]``.

    A module off the residual path (fairseq's own, or ours with the path off) runs
    fairseq's ``MultiheadAttention.forward``, which hands a full pass (no incremental
    state, ``static_kv`` False) to PyTorch's fused kernel, whose weights are averaged
    over heads. Giving it an empty incremental-state dict keeps it on fairseq's own
    materialized path (same projections, masks and softmax; the key/value cache it fills
    is thrown away), which returns per-head weights. Modules on a residual path
    materialize their probabilities whenever weights are requested.
    """
    kwargs = _as_keyword_arguments(module, args, kwargs)
    kwargs["need_weights"] = True
    kwargs["need_head_weights"] = True
    if kwargs.get("incremental_state") is None and not getattr(module, "residual", False):
        kwargs["incremental_state"] = {}
    if getattr(module, "residual", False):
        module.own_weights = None
    return (), kwargs


def _own_score_weights(module, weights: Tensor) -> Tensor:
    """The probabilities of the module's own scores, ``[H, B, T, S]``: what a residual
    module left in ``own_weights`` (see ``need_own_weights``); for any other attention
    module (fairseq's, or ours off the residual path) the weights it attended with,
    which are its own scores' softmax."""
    if not getattr(module, "residual", False):
        return weights
    own, module.own_weights = getattr(module, "own_weights", None), None
    if own is None:
        raise RuntimeError(f"{type(module).__name__} on a residual path returned no own-score probabilities "
                           "(need_own_weights)")
    return own


def _read_head_weights(record: list, own_record: list, layer: int, name: str, consumer, module, args, output):
    """Forward hook: the per-head weights ``[H, B, T, S]`` the module returned, and the
    probabilities of its own scores."""
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None or weights.dim() != 4 or weights.size(0) != module.num_heads:
        shape = None if weights is None else tuple(weights.shape)
        raise RuntimeError(
            f"{name} layer {layer + 1}: {type(module).__name__} returned weights of shape {shape}, "
            "expected per-head [heads, batch, tgt_len, src_len]"
        )
    weights = weights.detach()
    own = _own_score_weights(module, weights)
    if consumer is not None:
        consumer(name, layer, weights, own)
        return
    if record[layer] is not None:
        raise RuntimeError(f"{name} layer {layer + 1} ran twice in one forward pass")
    record[layer] = weights.transpose(0, 1).float()  # [B, H, T, S]
    own_record[layer] = own.transpose(0, 1).float()


@contextlib.contextmanager
def recording_attention(model, consumer: Optional[Callable[[str, int, Tensor, Tensor], None]] = None):
    """Within the block, every forward of ``model`` hands each attention module's
    probabilities to ``consumer(type, layer, weights, own)`` as the layer runs (both
    ``[H, B, T, S]``; ``own``: of the layer's own scores; nothing is kept), or, without a
    consumer, fills ``record[type][layer]`` and ``record.own[type][layer]`` with them as
    ``[B, H, T, S]`` (see :func:`attention_probabilities`)."""
    modules = attention_modules(model)
    record = _Record({t: [None] * len(ms) for t, ms in modules.items()})
    handles, flagged = [], []
    try:
        for t, ms in modules.items():
            for i, m in enumerate(ms):
                if hasattr(m, "need_own_weights"):
                    m.need_own_weights = True
                    flagged.append(m)
                handles.append(m.register_forward_pre_hook(_request_head_weights, with_kwargs=True))
                handles.append(m.register_forward_hook(
                    functools.partial(_read_head_weights, record[t], record.own[t], i, t, consumer)))
        yield record
    finally:
        for h in handles:
            h.remove()
        for m in flagged:
            m.need_own_weights, m.own_weights = False, None


class _Record(dict):
    """``{type: [B, H, T, S] per layer}`` of the attention used; ``own``: the same for
    the layers' own scores."""

    def __init__(self, layers):
        super().__init__(layers)
        self.own = {t: [None] * len(ls) for t, ls in layers.items()}

    def clear_batch(self):
        for record in (self, self.own):
            for layers in record.values():
                layers[:] = [None] * len(layers)

    def complete(self) -> Dict[str, List[Tensor]]:
        for t, layers in self.items():
            missing = [i + 1 for i, p in enumerate(layers) if p is None]
            if missing:
                raise RuntimeError(f"{t}: layers {missing} did not run in the forward pass")
        return {t: list(layers) for t, layers in self.items()}

    def complete_own(self) -> Dict[str, List[Tensor]]:
        self.complete()
        return {t: list(layers) for t, layers in self.own.items()}


def model_inputs(model, sample, pads) -> Tuple[dict, Dict[str, Tuple[Tensor, Tensor]]]:
    """``(forward kwargs, {type: (query_real [B, T], key_real [B, S])})`` for a batch.

    Decoder attention is teacher-forced on the reference (``prev_output_tokens``; the
    decoder builds its causal mask in a full pass)."""
    from fairseq.models import FairseqEncoderDecoderModel

    net_input = dict(sample["net_input"])
    src_real = net_input["src_tokens"].ne(pads["source"])
    masks = {"encoder_self": (src_real, src_real)}
    if isinstance(model, FairseqEncoderDecoderModel):
        tgt_real = net_input["prev_output_tokens"].ne(pads["target"])
        masks["decoder_self"] = (tgt_real, tgt_real)
        masks["cross"] = (tgt_real, src_real)
    return net_input, masks


def forward(model, net_input) -> None:
    """The model's forward pass on a batch (teacher-forced for encoder-decoder models);
    the output itself is not needed."""
    with torch.no_grad():
        model(**net_input, features_only=True)


def attention_probabilities(model, record, net_input, own_scores: bool = False):
    """One forward pass inside :func:`recording_attention` (without a consumer);
    ``{type: [B, H, T, S] per layer}`` of the attention used, or with ``own_scores`` the
    pair ``(used, own)``, ``own`` of the layers' own scores."""
    record.clear_batch()
    forward(model, net_input)
    probs, own = record.complete(), record.complete_own()
    record.clear_batch()
    return (probs, own) if own_scores else probs


def restore_masked_tokens(sample, pad: int) -> bool:
    """Put the original tokens back where a masked-LM task masked or replaced them
    (``target`` holds the original token there, padding elsewhere), so encoders are
    analysed on real text. Returns False when the sample has no such target."""
    src = sample["net_input"]["src_tokens"]
    target = sample.get("target")
    if not torch.is_tensor(target) or target.shape != src.shape:
        return False
    sample["net_input"]["src_tokens"] = torch.where(target.ne(pad), target, src)
    return True


# --------------------------------------------------------------------------- one checkpoint

# What the two sets of statistics in attention_stats.json are (written into it).
STATISTIC_SETS = {
    "used": "<type>.entropy_*, <type>.jsd_*: the attention each layer attends with (RealFormer: "
            "softmax(mask(A_n / c_n)) of the running sum A_n = A_{n-1} + Q_n K_n^T / sqrt(d))",
    "own_scores": "<type>.own_scores.entropy_*, .jsd_*: the same statistics of each layer's own scores, "
                  "softmax(mask(Q_n K_n^T / sqrt(d))) with the layer's masks and no residual sum (the control); "
                  ".max_abs_difference_from_used: per layer, the largest |own - used| probability",
}


@dataclass
class Analysis:
    """The result for one checkpoint."""

    checkpoint: str
    label: str
    types: Dict[str, TypeStats]
    sentences: int = 0
    skipped: int = 0
    batches_done: int = 0
    total_batches: int = 0
    seconds: float = 0.0
    settings: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.batches_done >= self.total_batches

    def to_json(self) -> dict:
        out = {t: s.to_json() for t, s in self.types.items()}
        out["statistic_sets"] = STATISTIC_SETS
        out["checkpoint"] = self.checkpoint
        out["sentences"] = self.sentences
        return out

    def details(self) -> dict:
        return {
            "checkpoint": self.checkpoint, "label": self.label, "sentences": self.sentences,
            "skipped_too_long": self.skipped, "seconds": round(self.seconds, 2),
            "quantile_error_bound_nats": BIN_WIDTH,
            "quartiles": list(QUARTILES),
            "tokens": {t: s.tokens for t, s in self.types.items()},
            "layers": {t: s.layers for t, s in self.types.items()},
            "heads": {t: s.heads for t, s in self.types.items()},
            "max_probability_on_padding": {t: s.padding_mass for t, s in self.types.items()},
            **self.settings,
        }

    # resumable state: histograms + progress, one .npz
    def save(self, path: str) -> None:
        arrays = {}
        for t, s in self.types.items():
            for attr in ("entropy", "jsd", "own_entropy", "own_jsd"):
                arrays.update(getattr(s, attr).state(f"{t}.{attr}"))
            arrays[f"{t}.own_difference"] = s.own_difference
        meta = {
            "settings": self.settings, "batches_done": self.batches_done, "total_batches": self.total_batches,
            "sentences": self.sentences, "skipped": self.skipped, "seconds": self.seconds,
            "types": {t: [s.layers, s.heads, s.tokens, s.padding_mass] for t, s in self.types.items()},
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)

    def restore(self, path: str) -> bool:
        """Load saved progress if it was made with the same settings; True if loaded."""
        if not os.path.exists(path):
            return False
        try:
            with np.load(path) as arrays:
                meta = json.loads(bytes(arrays["meta"]).decode())
                if meta["settings"] != self.settings:
                    return False
                types = {}
                for t, (layers, heads, tokens, pad) in meta["types"].items():
                    s = TypeStats(layers, heads, tokens=tokens, padding_mass=pad)
                    for attr in ("entropy", "jsd", "own_entropy", "own_jsd"):
                        getattr(s, attr).load(arrays, f"{t}.{attr}")
                    s.own_difference = np.array(arrays[f"{t}.own_difference"])
                    types[t] = s
        except (OSError, ValueError, KeyError):
            return False
        self.types = types
        self.batches_done, self.total_batches = meta["batches_done"], meta["total_batches"]
        self.sentences, self.skipped, self.seconds = meta["sentences"], meta["skipped"], meta["seconds"]
        return True


def _file_identity(path: str) -> str:
    st = os.stat(path)
    return hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


def describe_model(model, cfg) -> str:
    """A short label: arch, backbone (Post-LN / Pre-LN) and residual settings if any."""
    from ..residual_config import ResidualSettings, format_paths

    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None) or type(model).__name__
    pre_ln = bool(getattr(cfg.model, "encoder_normalize_before", False))
    settings = next(
        (m.residual for m in model.modules() if isinstance(getattr(m, "residual", None), ResidualSettings)), None
    )
    label = f"{arch} ({'Pre-LN' if pre_ln else 'Post-LN'}"
    if settings is not None:
        label += f", residual {settings.mode}: {format_paths(settings.paths)}" if settings.paths else ", residual none"
    return label + ")"


def load_checkpoint(path: str, data: str, device: str = "cpu"):
    """``(model, task, cfg)`` through fairseq's own loader (the plugin's safe loading)."""
    from fairseq import checkpoint_utils  # realformer_nmt is imported: models registered, loading safe

    if not os.path.isfile(path):
        raise CheckpointFileError(f"--path: no checkpoint file {path!r}")
    if not os.path.isdir(data):
        raise DataError(f"--data: {data!r} is not a directory (give the fairseq data-bin the model was trained on)")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    model = models[0].to(device).eval()
    return model, task, cfg


def _batches(task, model, subset: str, max_sentences: Optional[int], batch_size: int, max_tokens: int):
    """Deterministic batches of the first ``max_sentences`` items of the split, shortest
    first; returns ``(dataset, batches, skipped_too_long)``."""
    from fairseq import utils

    try:
        task.load_dataset(subset)
    except FileNotFoundError as exc:
        raise DataError(f"--subset: no {subset!r} split in {task.cfg.data} ({exc})") from exc
    dataset = task.dataset(subset)
    n = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    if n == 0:
        raise DataError(f"--subset: the {subset!r} split of {task.cfg.data} is empty")
    indices = np.arange(n, dtype=np.int64)
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    if max_positions is not None:
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
    else:
        ignored = []
    sizes = np.array([dataset.num_tokens(i) for i in indices], dtype=np.int64)
    indices = indices[np.argsort(sizes, kind="stable")]
    batches = dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=batch_size)
    return dataset, [np.asarray(b) for b in batches], len(ignored)


def analyze_checkpoint(
    path: str,
    data: str,
    subset: str = "test",
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    max_tokens: int = 8192,
    device: str = "cpu",
    mlm_input: str = "original",
    state_path: Optional[str] = None,
    save_every: float = 60.0,
    label: Optional[str] = None,
    log: Log = print,
) -> Analysis:
    """Stream the attention statistics of one checkpoint over a data split.

    With ``state_path``, progress is saved there every ``save_every`` seconds, at the
    end and on interruption; a later call with the same settings resumes from it (or
    returns at once when it was complete). ``mlm_input`` (encoder-only models trained
    with a masked-LM task): ``original`` analyses the text with masked tokens restored,
    ``masked`` the input exactly as the task masks it.
    """
    from fairseq import utils

    if mlm_input not in ("original", "masked"):
        raise ConfigError(f"--mlm-input: {mlm_input!r} is not one of original, masked")
    model, task, cfg = load_checkpoint(path, data, device)
    modules = attention_modules(model)
    settings = {
        "checkpoint_identity": _file_identity(path), "data": os.path.abspath(data), "subset": subset,
        "max_sentences": max_sentences, "batch_size": batch_size, "max_tokens": max_tokens,
        "mlm_input": mlm_input, "bin_width": BIN_WIDTH,
    }
    analysis = Analysis(
        checkpoint=path, label=label or describe_model(model, cfg),
        types={t: TypeStats(len(ms), ms[0].num_heads) for t, ms in modules.items()},
        settings=settings,
    )
    resumed = state_path is not None and analysis.restore(state_path)
    if state_path is not None and os.path.exists(state_path) and not resumed:
        log(f"[{analysis.label}] {state_path} was made with other settings or another checkpoint: starting over")
    if resumed and analysis.complete:
        log(f"[{analysis.label}] already analysed ({analysis.sentences} sentences): {state_path}")
        return analysis

    dataset, batches, skipped = _batches(task, model, subset, max_sentences, batch_size, max_tokens)
    analysis.total_batches, analysis.skipped = len(batches), skipped
    if resumed:
        log(f"[{analysis.label}] resuming at batch {analysis.batches_done + 1}/{len(batches)}")
    else:
        analysis.batches_done = analysis.sentences = 0
    if skipped:
        log(f"[{analysis.label}] skipping {skipped} sentences longer than the model's max positions")
    pads = {"source": task.source_dictionary.pad()}
    if "decoder_self" in modules or "cross" in modules:
        pads["target"] = task.target_dictionary.pad()
    restore = mlm_input == "original" and "target" not in pads  # encoder-only: masked-LM inputs
    log(f"[{analysis.label}] {path}: {', '.join(f'{t} {s.layers}x{s.heads}' for t, s in analysis.types.items())} "
        f"(layers x heads); {subset}: {sum(len(b) for b in batches)} sentences in {len(batches)} batches")

    start, last_save, last_log = time.time(), time.time(), 0.0
    elapsed_before = analysis.seconds

    def consume(attention_type, layer, weights, own):
        analysis.types[attention_type].add_layer(layer, weights, own)

    try:
        with recording_attention(model, consume):
            for b in range(analysis.batches_done, len(batches)):
                sample = dataset.collater([dataset[int(i)] for i in batches[b]])
                if restore and not restore_masked_tokens(sample, pads["source"]):
                    if b == analysis.batches_done:
                        log(f"[{analysis.label}] no masked-LM target in the batches: analysing the input as given")
                if device != "cpu":
                    sample = utils.move_to_cuda(sample, device=torch.device(device))
                net_input, masks = model_inputs(model, sample, pads)
                for t, stats in analysis.types.items():
                    stats.begin_batch(*masks[t])
                forward(model, net_input)
                for stats in analysis.types.values():
                    stats.end_batch()
                analysis.batches_done = b + 1
                analysis.sentences += len(batches[b])
                analysis.seconds = elapsed_before + time.time() - start
                now = time.time()
                if now - last_log >= 10 or b + 1 == len(batches):
                    last_log = now
                    log(f"[{analysis.label}] batch {b + 1}/{len(batches)}, {analysis.sentences} sentences, "
                        f"{analysis.seconds:.1f} s")
                if state_path is not None and now - last_save >= save_every:
                    analysis.save(state_path)
                    last_save = now
    finally:
        if state_path is not None:
            analysis.save(state_path)
    return analysis


# --------------------------------------------------------------------------- outputs

def colour_of(statistic: str, median: float) -> str:
    low, high = THRESHOLDS[statistic]
    if median > high:
        return "red"
    if median < low:
        return "blue"
    return "yellow"


def _row_names(statistic: str, rows: int) -> List[str]:
    if statistic == "entropy":
        return [f"layer {i + 1}" for i in range(rows)]
    return [f"layers {i + 1}-{i + 2}" for i in range(rows)]


def plot_violins(analyses: Sequence[Analysis], attention_type: str, statistic: str, path: str,
                 source: str = "used") -> bool:
    """One figure: a row per layer (JSD: per adjacent pair), a column per model, heads
    sorted by median, violins coloured by the paper's thresholds. ``source``: ``used``
    (the attention the layers attend with) or ``own`` (their own scores, the control).
    False if no model has this attention type (with more than one layer, for JSD)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    present = [a.types.get(attention_type) for a in analyses]
    rows = max((s.layers if statistic == "entropy" else s.layers - 1) for s in present if s is not None) \
        if any(s is not None for s in present) else 0
    if rows <= 0:
        return False
    heads = max(s.heads for s in present if s is not None)
    cols = len(analyses)
    fig = Figure(figsize=(max(6.0, cols * max(3.4, 0.42 * heads + 1.4)), rows * 1.35 + 1.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    ymax = LN2 if statistic == "jsd" else max(  # the same scale for used and own
        (float(np.nanmax(s.histogram(statistic, src).max)) for s in present if s is not None and s.tokens
         for src in ("used", "own")), default=1.0
    )
    names = _row_names(statistic, rows)
    for c, (analysis, stats) in enumerate(zip(analyses, present)):
        axes[0, c].set_title("\n".join(textwrap.wrap(analysis.label, 44)), fontsize=8)
        hist = stats.histogram(statistic, source) if stats is not None else None
        q = hist.quantiles(QUARTILES) if hist is not None else None
        for r in range(rows):
            ax = axes[r, c]
            if c == 0:
                ax.set_ylabel(names[r], fontsize=8)
            ax.set_ylim(0, ymax * 1.05 if ymax > 0 else 1.0)
            ax.tick_params(labelsize=7)
            series = [r * stats.heads + h for h in range(stats.heads)] if stats is not None and r < (
                stats.layers if statistic == "entropy" else stats.layers - 1) else []
            if not series or hist.total()[series].sum() == 0:
                ax.text(0.5, 0.5, "absent", ha="center", va="center", transform=ax.transAxes, fontsize=8)
                ax.set_xticks([])
                continue
            order = sorted(series, key=lambda s: q[s, 1])
            vpstats = []
            for s in order:
                coords, vals = hist.density(s)
                vpstats.append({"coords": coords, "vals": vals, "mean": hist.sum[s] / max(hist.total()[s], 1),
                                "median": q[s, 1], "min": hist.min[s], "max": hist.max[s],
                                "quantiles": [q[s, 0], q[s, 2]]})
            parts = ax.violin(vpstats, positions=range(1, len(order) + 1), widths=0.8,
                              showmedians=True, showextrema=False)
            for body, s in zip(parts["bodies"], order):
                body.set_facecolor(COLOURS[colour_of(statistic, q[s, 1])])
                body.set_edgecolor("#333333")
                body.set_alpha(0.85)
                body.set_linewidth(0.4)
            parts["cmedians"].set_color("#111111")
            parts["cmedians"].set_linewidth(1.4)
            if "cquantiles" in parts:  # first and third quartiles
                parts["cquantiles"].set_color("#333333")
                parts["cquantiles"].set_linewidth(0.6)
                parts["cquantiles"].set_linestyle((0, (2, 2)))
            ax.set_xticks(range(1, len(order) + 1))
            ax.set_xticklabels([f"h{s - r * stats.heads + 1}" for s in order], fontsize=6)
    low, high = THRESHOLDS[statistic]
    what = "attention entropy (nats)" if statistic == "entropy" else "JSD to the same head one layer below (nats)"
    if source == "own":
        what += ",\nof each layer's own scores softmax(mask(Q_n K_n^T / sqrt(d))) (control: no residual sum)"
    fig.suptitle(f"{attention_type}: {what}\nheads sorted by median (thick line); quartiles dashed", fontsize=9)
    fig.legend(
        handles=[Patch(color=COLOURS["red"], label=f"median > {high}"),
                 Patch(color=COLOURS["yellow"], label=f"{low} <= median <= {high}"),
                 Patch(color=COLOURS["blue"], label=f"median < {low}")],
        loc="lower center", ncol=3, fontsize=8, frameon=False,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    return True


SUMMARY_KEYS = ("entropy_median", "jsd_median", "own_entropy_median", "own_jsd_median")


def layer_summary(analyses: Sequence[Analysis]) -> Dict[str, List[dict]]:
    """Per type and layer: median entropy over all heads and tokens of the layer, and
    median JSD between the layer and the one below (pooled over heads), per model; of
    the attention used (``entropy_median``, ``jsd_median``) and of the layers' own scores
    (``own_entropy_median``, ``own_jsd_median``), and ``own_max_abs_difference``."""
    out = {}
    types = [t for t in ATTENTION_TYPES if any(t in a.types for a in analyses)]
    for t in types:
        rows = []
        layers = max(a.types[t].layers for a in analyses if t in a.types)
        for layer in range(layers):
            row = {"layer": layer + 1, **{k: [] for k in SUMMARY_KEYS}, "own_max_abs_difference": []}
            for a in analyses:
                s = a.types.get(t)
                values = dict.fromkeys(SUMMARY_KEYS)
                difference = None
                if s is not None and layer < s.layers:
                    difference = round(float(s.own_difference[layer]), 6)
                    for source, prefix in (("used", ""), ("own", "own_")):
                        ent = s.histogram("entropy", source).pooled(range(layer * s.heads, (layer + 1) * s.heads))
                        values[f"{prefix}entropy_median"] = float(ent.median()[0])
                        if layer >= 1:
                            pair = range((layer - 1) * s.heads, layer * s.heads)
                            values[f"{prefix}jsd_median"] = float(s.histogram("jsd", source).pooled(pair).median()[0])
                for k in SUMMARY_KEYS:
                    row[k].append(_none_for_nan(values[k]))
                row["own_max_abs_difference"].append(difference)
            rows.append(row)
        out[t] = rows
    return out


CONTROL_NOTE = (
    "Control (own scores). A RealFormer layer n > 1 attends with softmax(mask(A_n / c_n)), "
    "A_n = A_{n-1} + S_n, S_n = Q_n K_n^T / sqrt(d): its attention contains the layers below by "
    "construction, so adjacent layers are partly alike, and summed logits are sharper, whatever was learned. "
    "The `own` columns are the same statistics of softmax(mask(S_n)), each layer's own scores with the "
    "layer's masks and no residual sum. A low own-score JSD (or entropy) is learned: the layers' own "
    "queries and keys agree (or are sharp); what the used columns show beyond the own ones is "
    "contributed by the residual sum. For fairseq's own attention (Post-LN, Pre-LN, a path set to none) "
    "and for the first layer of a RealFormer path the own scores are the attention used "
    "(`own_max_abs_difference` = 0 in run.json), so there the control equals the measurement."
)


def summary_markdown(analyses: Sequence[Analysis], summary: Dict[str, List[dict]]) -> str:
    def fmt(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    lines = ["Median attention entropy of each layer and median JSD between the layer and the one "
             "below (same head), over all heads and real query tokens; natural log "
             f"(medians within {BIN_WIDTH} nats). `entropy`, `JSD`: the attention each layer uses; "
             "`own entropy`, `own JSD`: the same of each layer's own scores (the control below).", ""]
    names = list("AB") if len(analyses) > 1 else [""]
    for i, a in enumerate(analyses):
        lines.append(f"- {names[i] or 'model'}: {a.label}, `{a.checkpoint}`, {a.sentences} sentences")
    lines += ["", CONTROL_NOTE]
    for t, rows in summary.items():
        lines += ["", f"### {t}", ""]
        head = ["layer"] + [f"{what} {x}".strip() for what in ("entropy", "own entropy", "JSD", "own JSD")
                            for x in names]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + " --- |" * len(head))
        for row in rows:
            cells = [str(row["layer"])] + [fmt(v) for k in ("entropy_median", "own_entropy_median", "jsd_median",
                                                              "own_jsd_median") for v in row[k]]
            lines.append("| " + " | ".join(cells) + " |")
        same = [names[i] or "The model" for i in range(len(analyses))
                if all(r["own_max_abs_difference"][i] in (0.0, None) for r in rows)]
        if same:
            lines += ["", f"{', '.join(same)}: own scores are the attention used in every layer "
                      "(largest difference 0), so own = used there."]
    return "\n".join(lines) + "\n"


def write_json(path: str, obj) -> None:
    """Indented JSON with each innermost list of numbers on one line; atomic. Paths inside
    the repository are written relative to it."""
    text = json.dumps(fairseq_runs.portable(obj), indent=1, allow_nan=False)
    text = re.sub(r"\[\s*([^\[\]{}\"]*?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def analyze_and_report(
    path: str,
    data: str,
    out: str,
    compare: Optional[str] = None,
    subset: str = "test",
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    max_tokens: int = 8192,
    device: str = "cpu",
    mlm_input: str = "original",
    labels: Sequence[Optional[str]] = (None, None),
    force: bool = False,
    save_every: float = 60.0,
    log: Log = print,
) -> dict:
    """Analyse ``path`` (and ``compare``) and write into ``out``: ``attention_stats.json``
    (``attention_stats_compare.json``), one PNG per attention type and statistic
    (``<type>_entropy.png``, ``<type>_jsd.png``, both models side by side with
    ``compare``; ``<type>_entropy_own_scores.png``, ``<type>_jsd_own_scores.png`` the same
    for the layers' own scores), ``summary.md`` and ``run.json``. Progress lives in
    ``out/state_*.npz``: re-running resumes (``force`` starts over). Returns the paths
    written and the per-layer summary."""
    os.makedirs(out, exist_ok=True)
    checkpoints = [("path", path)] + ([("compare", compare)] if compare else [])
    analyses = []
    for (tag, ckpt), label in zip(checkpoints, labels):
        state = os.path.join(out, f"state_{tag}.npz")
        if force and os.path.exists(state):
            os.remove(state)
        analyses.append(analyze_checkpoint(
            ckpt, data, subset=subset, max_sentences=max_sentences, batch_size=batch_size,
            max_tokens=max_tokens, device=device, mlm_input=mlm_input, state_path=state,
            save_every=save_every, label=label, log=log,
        ))
    if len(analyses) == 2 and analyses[0].label == analyses[1].label:
        for a, suffix in zip(analyses, ("(--path)", "(--compare)")):
            a.label = f"{a.label} {suffix}"

    written = {"json": [], "png": []}
    for (tag, _), a in zip(checkpoints, analyses):
        name = "attention_stats.json" if tag == "path" else "attention_stats_compare.json"
        write_json(os.path.join(out, name), a.to_json())
        written["json"].append(os.path.join(out, name))
    for t in ATTENTION_TYPES:
        for stat in STATISTICS:
            for source, suffix in (("used", ""), ("own", "_own_scores")):
                png = os.path.join(out, f"{t}_{stat}{suffix}.png")
                if plot_violins(analyses, t, stat, png, source):
                    written["png"].append(png)
    summary = layer_summary(analyses)
    markdown = summary_markdown(analyses, summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown)
    write_json(os.path.join(out, "run.json"), {
        "models": [a.details() for a in analyses], "layer_summary": summary,
        "figures": [os.path.basename(p) for p in written["png"]],
    })
    written["summary"] = os.path.join(out, "summary.md")
    written["markdown"] = markdown
    written["layer_summary"] = summary
    return written
