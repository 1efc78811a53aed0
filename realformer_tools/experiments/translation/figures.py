"""The plot pieces the studies' figures share (and the summary figure): matplotlib
without a display, one colour per backbone, a validation curve with its band over seeds.
Imports nothing of the studies, so every figure can use it."""


COLORS = {"postln": "tab:blue", "preln": "tab:orange", "realformer": "tab:green", "realformer_mean": "tab:red",
           "realformer_preln": "tab:purple",
           "realformer_encoder": "tab:cyan", "realformer_decoder": "tab:brown", "realformer_cross": "tab:pink",
           "preln_vr": "tab:olive", "realformer_preln_vr": "tab:gray"}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve_with_band(ax, s, color, label):
    """Mean validation curve of one entry, with its min-max band over seeds."""
    if not s["curve"]:
        ax.plot([], [], color=color, label=label + " (no finite valid loss)")
        return
    ax.plot(*zip(*s["curve"]), marker="o", markersize=2, color=color, label=label)
    if len(s["seeds"]) > 1 and s["curve_min_max"]:
        band = s["curve_min_max"]
        ax.fill_between([u for u, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                        color=color, alpha=0.2)


def paired_curves(s, reference, seeds=None):
    """Per validation update, ``s``'s validation loss minus ``reference``'s on the same seed:
    ``[(update, mean, low, high)]`` over the seeds both have (or ``seeds``), at the updates
    both logged; low and high are the smallest and largest seed's difference."""
    mine = dict(zip(s["seeds"], s.get("curve_per_seed") or []))
    theirs = dict(zip(reference["seeds"], reference.get("curve_per_seed") or []))
    common = [seed for seed in s["seeds"] if seed in theirs and seed in mine and (seeds is None or seed in seeds)]
    by_update = {}
    for seed in common:
        ref = dict((u, v) for u, v in theirs[seed])
        for u, v in mine[seed]:
            if u in ref and v is not None and ref[u] is not None:
                by_update.setdefault(u, []).append(v - ref[u])
    return [(u, sum(d) / len(d), min(d), max(d)) for u, d in sorted(by_update.items()) if len(d) == len(common)]


def curve_over_seeds(s, seeds):
    """``s``'s mean validation curve and its min-max band over ``seeds`` only:
    ``[(update, mean, low, high)]`` at the updates every one of those seeds logged."""
    runs = [curve for seed, curve in zip(s["seeds"], s.get("curve_per_seed") or []) if seed in seeds]
    by_update = {}
    for curve in runs:
        for u, v in curve:
            if v is not None:
                by_update.setdefault(u, []).append(v)
    return [(u, sum(v) / len(v), min(v), max(v)) for u, v in sorted(by_update.items()) if runs and len(v) == len(runs)]
