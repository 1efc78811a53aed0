"""What every study writes: JSON, Markdown and PNG beside it, and the cells and plot
pieces the studies' tables and figures share."""

import os

from .. import fairseq_runs


def write_outputs(summary, json_path, markdown, plot):
    """``json_path`` plus ``.md`` and ``.png`` beside it; paths inside the repository are
    written relative to it (committed results carry no paths of the machine they ran on)."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)) or ".", exist_ok=True)
    stem = os.path.splitext(json_path)[0]
    summary = fairseq_runs.portable(fairseq_runs.finite_or_none(summary))
    fairseq_runs.write_json(json_path, summary)
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(summary))
    plot(summary, stem + ".png")


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def seconds(s):
    return "n/a" if s is None else f"{s / 60:.1f} min"


def bleu_cell(s, n_seeds):
    bleu = fmt(s["bleu"]) + (f" ± {s['bleu_std']:.2f}" if s["bleu_std"] is not None else "")
    if n_seeds == 1:
        bleu += " (1 seed)"
    diverged = [seed for seed, st in zip(s["seeds"], s["status_per_seed"]) if st not in ("finished", "ok")]
    if diverged:
        bleu += f" (not ok: seeds {diverged})"
    return bleu


def paired_cell(s, key="paired_vs_postln"):
    tests = s.get(key)
    if not tests:
        return "—"
    return ", ".join(f"s{t['seed']}: {t['delta_bleu']:+.2f} (p={t['p_value']:.3f})" for t in tests)


def recipe_lines(summary):
    lines = ["", "Shared fairseq-train flags:", "", "```", " ".join(summary["recipe"]["shared_train_flags"]),
             "```", "", f"Decoding: `fairseq-generate {' '.join(summary['recipe']['generate_flags'])}`", "",
             f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", ""]
    if summary.get("paired_test"):
        lines += [f"Paired test: {summary['paired_test']}.", ""]
    lines += [f"Machine: {summary['machine']}. Wall times depend on the load of the machine; the "
              "budget is a fixed number of updates, identical for every backbone.", ""]
    return lines


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
