"""Re-render committed results from their JSON alone (no training, no decoding):

    python -m realformer_tools.experiments.translation.rerender results/*.json

Each JSON is brought to the current record (``upgrade``: the one outcome vocabulary
``ok`` / ``lagging`` / ``diverged`` with its reference named, the seed-paired differences,
the paired test described for what it measures) and written back with its ``.md`` and
``.png`` (``results/speed_*.json``: its ``.md``). Upgrading is idempotent: re-rendering a
re-rendered file changes nothing. JSON files that are not study results are skipped.
Then each folder of the study JSONs given gets ``summary.png``: every study JSON in it,
its seed-paired differences in one figure (``summary.py``).
"""

import json
import os
import re
import sys

from realformer_nmt.errors import RealFormerError

from .ablation import ablation_markdown, plot_ablation
from .compare import comparison_markdown, plot_comparison
from .depth import DEPTH_REFERENCE, depth_markdown, plot_depth
from .lr_sweep import classify_sweep, plot_sweep, sweep_markdown, sweep_reference, sweep_seed_paired
from .pairs import add_pairs
from .recipe import ABLATION, MAIN_ORDER
from .report import write_outputs
from .stability import add_corrected, best_rates, plot_stability, stability_markdown
from .stats import (
    PAIRED_TEST_NOTE,
    add_seed_paired,
    add_test_set_paired,
    outcome_rule,
    reference_record,
    test_set_means,
)
from .summary import kind, write_summary

RENAMED = {"stalled": "lagging"}  # the depth and lr studies' old word for it


def _outcomes(entry):
    """Old entries kept fairseq's status (``finished``) where the studies now give outcomes."""
    if "fairseq_status_per_seed" not in entry:
        entry["fairseq_status_per_seed"] = list(entry["status_per_seed"])
        values = entry.get("bleu_per_seed", entry.get("mlm_accuracy_per_seed"))
        entry["status_per_seed"] = ["ok" if st == "finished" and v is not None else "diverged"
                                    for st, v in zip(entry["status_per_seed"], values)]
    entry["status_per_seed"] = [RENAMED.get(st, st) for st in entry["status_per_seed"]]


def _paired_note(summary):
    if summary.get("paired_test"):
        samples = re.search(r"\((\d+) resamples", summary["paired_test"])
        summary["paired_test"] = PAIRED_TEST_NOTE.format(samples=samples.group(1) if samples else 1000)


def upgrade(summary):
    """``summary`` in the current record of its study (in place; returns its kind)."""
    k = kind(summary)
    if k in ("comparison", "mlm"):
        entries = {b: summary[b] for b in MAIN_ORDER if b in summary}
        for e in entries.values():
            _outcomes(e)
        add_seed_paired(entries, metric="mlm_accuracy_per_seed" if k == "mlm" else "bleu_per_seed")
        if k == "comparison":
            for e in entries.values():
                test_set_means(e)
            add_pairs(add_test_set_paired(entries))
        _paired_note(summary)
    elif k == "ablation":
        entries = {key: summary[key] for key in ABLATION if key in summary}
        for e in entries.values():
            _outcomes(e)
        add_seed_paired(entries, backbone_of=ABLATION.get)
        _paired_note(summary)
    elif k == "depth":
        for row in summary["depths"].values():
            for e in row.values():
                e["status_per_seed"] = [RENAMED.get(st, st) for st in e["status_per_seed"]]
            add_seed_paired(row)
        summary["rule"] = outcome_rule(summary["margin"], DEPTH_REFERENCE)
        summary["reference"] = DEPTH_REFERENCE
    elif k == "lr_sweep":
        for by_lr in summary["runs"].values():
            for entries in by_lr.values():
                for e in entries:
                    e["outcome"] = RENAMED.get(e["outcome"], e["outcome"])
        reference = classify_sweep(summary["runs"], summary["margin"])  # the one rule of every study
        summary["divergence_rule"] = outcome_rule(summary["margin"], sweep_reference(summary["normal_lr"]))
        summary["reference"] = sweep_reference(summary["normal_lr"])
        summary["reference_loss_per_seed"] = reference_record(reference)
        summary.update(sweep_seed_paired(summary["runs"]))
    elif k == "stability":
        for row in summary["grid"].values():
            add_seed_paired(row)
        add_corrected(summary["grid"])
        summary["best_rate"] = best_rates(summary["grid"])
    if isinstance(summary.get("machine"), str):  # the threads do change float rounding (docs/results.md)
        summary["machine"] = summary["machine"].replace(" (results do not depend on it)", "")
    return k


def writers(k):
    """Markdown and plot writers of a study kind."""
    from .. import mlm_compare

    return {
        "comparison": (comparison_markdown, plot_comparison),
        "ablation": (ablation_markdown, plot_ablation),
        "depth": (depth_markdown, plot_depth),
        "lr_sweep": (sweep_markdown, plot_sweep),
        "stability": (stability_markdown, plot_stability),
        "mlm": (mlm_compare.comparison_markdown, mlm_compare.plot_comparison),
    }[k]


def rerender(path, plot=True, log=print):
    """Upgrade ``path`` and write it back with its Markdown (and plot); returns its kind."""
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    k = upgrade(summary) if isinstance(summary, dict) else None
    if k is None:
        log(f"[rerender] {path}: not a study's results, skipped")
        return None
    if k == "speed":
        from .. import benchmark

        with open(path[: -len(".json")] + ".md", "w", encoding="utf-8") as f:
            f.write(benchmark.markdown(summary))
    else:
        markdown, plotter = writers(k)
        write_outputs(summary, path, markdown, plotter if plot else (lambda summary, path: None), refresh_summary=False)
    log(f"[rerender] {path} ({k}): wrote .md{', .png' if plot and k != 'speed' else ''}"
        f"{'' if k == 'speed' else ' and the JSON'}")
    return k


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m realformer_tools.experiments.translation.rerender",
        description="Re-render committed results from their JSON alone (no training): each study JSON "
                    "is brought to the current record and written back with its .md and .png; then "
                    "summary.png is drawn in each folder from every study JSON in it.",
    )
    parser.add_argument("paths", nargs="+", metavar="RESULTS_JSON",
                        help="results JSON files (e.g. results/*.json); files that are not a study's "
                             "results are skipped")
    return parser.parse_args(argv)


def main(argv=None):
    import logging

    logging.basicConfig(format="%(message)s", level=logging.WARNING, force=True)  # fairseq's import sets DEBUG
    paths = parse_args(argv).paths
    try:
        folders = []
        for path in paths:
            if rerender(path) not in (None, "speed") and os.path.dirname(path) not in folders:
                folders.append(os.path.dirname(path))
        for path in folders:
            write_summary(path or ".")
    except (OSError, ValueError, KeyError, RealFormerError) as exc:
        print(f"rerender: error: {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
