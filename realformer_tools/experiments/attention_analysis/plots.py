"""The paper's violin figures (Figs 4-8): a row per layer (JSD: per adjacent pair), a
column per model, heads sorted by median, coloured by the paper's thresholds."""

import textwrap
from typing import List, Sequence

import numpy as np

from .analysis import Analysis
from .estimators import LN2, QUARTILES

# The paper's colour code (Figs 4-8): a head's median above the upper threshold is red,
# below the lower one blue, otherwise yellow.
THRESHOLDS = {"entropy": (1.5, 4.5), "jsd": (0.25, 0.75)}
COLOURS = {"blue": "#4a7cc9", "yellow": "#f2c230", "red": "#d9473b"}


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
