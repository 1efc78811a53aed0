"""The plot pieces the studies' figures share (and the summary figure): matplotlib
without a display, one colour per backbone, a validation curve with its band over seeds.
Imports nothing of the studies, so every figure can use it."""


COLORS = {"postln": "tab:blue", "preln": "tab:orange", "realformer": "tab:green", "realformer_mean": "tab:red",
           "realformer_preln": "tab:olive",
           "realformer_encoder": "tab:purple", "realformer_decoder": "tab:brown", "realformer_cross": "tab:pink"}


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
