"""Streaming summaries: fixed-width histograms of non-negative values (medians and
quartiles within one bin width of the exact ones, exact min and max), and
:class:`TypeStats`, the histograms of one attention type (per layer and head, of the
attention used and of the layers' own scores), fed one layer at a time."""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from torch import Tensor

from .estimators import BIN_WIDTH, QUARTILES, STATISTICS, LayerStream


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
