"""What every study writes: JSON, Markdown and PNG beside it, and the cells the studies'
tables share (the plot pieces: ``figures.py``)."""

import os

from .. import fairseq_runs


def write_outputs(summary, json_path, markdown, plot, refresh_summary=True):
    """``json_path`` plus ``.md`` and ``.png`` beside it; paths inside the repository are
    written relative to it (committed results carry no paths of the machine they ran on).
    Where the folder has a ``summary.png`` (``results/``), it is drawn again with this study
    in it (``refresh_summary``; the rerender command draws it once at the end instead)."""
    folder = os.path.dirname(os.path.abspath(json_path)) or "."
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(json_path)[0]
    summary = fairseq_runs.portable(fairseq_runs.finite_or_none(summary))
    fairseq_runs.write_json(json_path, summary)
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(summary))
    plot(summary, stem + ".png")
    if refresh_summary and os.path.exists(os.path.join(folder, "summary.png")):
        from .summary import write_summary

        write_summary(folder, log=lambda message: None)


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def seconds(s):
    return "n/a" if s is None else f"{s / 60:.1f} min"


def spread(mean, std, values, digits=2):
    """A mean and its spread over seeds: ``± sd`` with 3 or more values, the range of two
    (never ``± sd`` of two), ``(1 seed)`` for one."""
    finite = [v for v in values if v is not None]
    if len(finite) >= 3 and std is not None:
        return f"{fmt(mean, digits)} ± {std:.{digits}f}"
    if len(finite) == 2:
        return f"{fmt(mean, digits)} (range {fmt(min(finite), digits)}–{fmt(max(finite), digits)})"
    return fmt(mean, digits) + (" (1 seed)" if finite else "")


def bleu_cell(s, n_seeds=None):
    bleu = spread(s["bleu"], s["bleu_std"], s["bleu_per_seed"])
    diverged = [seed for seed, st in zip(s["seeds"], s["status_per_seed"]) if st not in ("finished", "ok")]
    if diverged:
        bleu += f" (not ok: seeds {diverged})"
    return bleu


def spread_word(n_seeds):
    return "± sd" if n_seeds >= 3 else "range" if n_seeds == 2 else "one seed"


def outcome_table(row, backbones):
    """One row per backbone of a study with outcomes: outcome per seed, BLEU, the seed-paired
    differences to Post-LN and Pre-LN, best valid loss (``row[b]`` None: "not run")."""
    refs = [(key, header) for key, header in (("seed_paired_vs_postln", "vs Post-LN, seed-paired ΔBLEU"),
                                              ("seed_paired_vs_preln", "vs Pre-LN, seed-paired ΔBLEU"))
            if any(row.get(b) and row[b].get(key) for b in backbones)]
    lines = ["| backbone | outcome per seed | test BLEU | BLEU per seed | " + "".join(f"{h} | " for _, h in refs)
             + "best valid loss | valid loss per seed |",
             "| --- | --- | --- | --- | " + "--- | " * len(refs) + "--- | --- |"]
    for b in backbones:
        e = row.get(b)
        if e is None:
            lines.append(f"| {b} | not run | " + "| " * (len(refs) + 4))
            continue
        lines.append(f"| {b} | {', '.join(e['status_per_seed'])} | {bleu_cell(e)} "
                     f"| {', '.join(fmt(x) for x in e['bleu_per_seed'])} | "
                     + "".join(f"{seed_paired_cell(e, key)} | " for key, _ in refs)
                     + f"{fmt(e['valid_loss'], 3)} | {', '.join(fmt(x, 3) for x in e['valid_loss_per_seed'])} |")
    return lines


def excludes_zero(paired):
    """Whether the record's interval excludes zero: the corrected one where the record has one
    (``ci95_corrected``: a study asking one question several times), else its 95% interval."""
    ci = (paired or {}).get("ci95_corrected") or (paired or {}).get("ci95")
    return bool(ci) and (ci[0] > 0 or ci[1] < 0)


def seed_paired_cell(s, key="seed_paired_vs_postln", digits=2):
    """Per-seed differences and their mean; ``± sd`` and the 95% interval with 3 or more seeds,
    bold only where the interval excludes zero (``digits``: decimals shown)."""
    p = s.get(key) if s else None
    if not p or not p["per_seed"]:
        return "—"
    d = digits
    per_seed = " / ".join(f"{v:+.{d}f}" for v in p["per_seed"])
    if len(p["per_seed"]) == 1:
        return f"{per_seed} (1 seed)"
    if p.get("ci95") is None:
        return f"{per_seed} (mean {p['mean']:+.{d}f})"
    cell = f"{p['mean']:+.{d}f} ± {p['sd']:.{d}f} (95% CI {p['ci95'][0]:+.{d}f} to {p['ci95'][1]:+.{d}f}"
    if p.get("ci95_corrected"):
        low, high = p["ci95_corrected"]
        cell += f"; corrected for {p['corrected_for']} {p.get('corrected_what', 'rates')} {low:+.{d}f} to {high:+.{d}f}"
    cell = f"{cell})"
    cell = f"**{cell}**" if excludes_zero(p) else cell
    return f"{per_seed} = {cell}"


SEED_PAIRED_NOTE = ("Seed-paired difference: backbone minus reference on the same seed (same data order and "
                    "initialization seed), per seed and their mean; with 3 or more seeds ± sd over seeds and a "
                    "95% interval (Student t); with two seeds both values. Bold: the interval excludes zero")


def paired_cell(s, key="paired_vs_postln"):
    tests = s.get(key)
    if not tests:
        return "—"
    return ", ".join(f"s{t['seed']}: {t['delta_bleu']:+.2f} (p={t['p_value']:.3f})" for t in tests)


def recipe_lines(summary):
    from .recipe import ENVIRONMENT

    lines = ["", "Shared fairseq-train flags:", "", "```", " ".join(summary["recipe"]["shared_train_flags"]),
             "```", "", f"Decoding: `fairseq-generate {' '.join(summary['recipe']['generate_flags'])}`", "",
             f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", ""]
    # the switch every run had (unrecorded: trained before it existed, when the fixes were always on)
    environment = dict(ENVIRONMENT, **(summary["recipe"].get("environment") or {}))
    lines += ["Environment of every fairseq-train and fairseq-generate run: "
              + " ".join(f"`{k}={v}`" for k, v in sorted(environment.items()))
              + " (without it fairseq drops up to 7 sentences per batching and the numbers differ; "
              "docs/reliability.md).", ""]
    if summary.get("paired_test"):
        lines += [f"Paired test: {summary['paired_test']}.", ""]
    lines += [f"Machine: {summary['machine']}. Wall times depend on the load of the machine; the "
              "budget is a fixed number of updates, identical for every backbone.", ""]
    return lines + imported_lines(summary)


def imported_runs(summary, label=""):
    """``{file: ["<depth>+<depth> <backbone> seed <k>", "lr <lr> <backbone> seed <k>", ...]}``:
    the runs of a summary taken from a committed results file (``--import-results``) rather
    than trained in its run folder."""
    found = {}
    for key, value in summary.items():
        if not isinstance(value, dict) or key in ("recipe", "progress"):
            continue
        if "imported_from_per_seed" in value:
            for seed, source in zip(value["seeds"], value["imported_from_per_seed"]):
                if source:
                    found.setdefault(source, []).append(f"{label}{key} seed {seed}")
        elif key in ("depths", "grid"):  # the depth test's and the stability grid's rows
            for row_key, row in value.items():
                prefix = f"{row_key}+{row_key} " if key == "depths" else f"lr {row_key} "
                for source, runs in imported_runs(row or {}, prefix).items():
                    found.setdefault(source, []).extend(runs)
    return found


def imported_lines(summary):
    """The Markdown note naming the imported runs (none: no lines)."""
    lines = []
    for source, runs in imported_runs(summary).items():
        lines += [f"Taken from `{source}` (trained earlier with the identical recipe, so not trained again; "
                  "fairseq's CPU training reproduces a run exactly on the same kind of machine with the same "
                  "threads, and elsewhere gives a slightly different run of the same seed, "
                  f"docs/results.md): {', '.join(runs)}.", ""]
    return lines

def not_run_lines(summary):
    """The Markdown note listing the runs a partial report leaves out (none: no lines)."""
    missing = (summary.get("progress") or {}).get("missing") or []
    if not missing:
        return []
    names = ", ".join(" ".join(f"{k} {v:g}" if k == "lr" else f"{v}" if k == "backbone" else f"{k} {v}"
                               for k, v in m.items()) for m in missing)
    return [f"**Partial results**: {len(missing)} of {len(missing) + len(summary['progress']['done'])} runs not run "
            f"or not finished yet, left out of every number here: {names}.", ""]


def test_set_names(summary, backbones):
    """The test sets the entries were scored on, the headline first (one: the headline only)."""
    names = [t["name"] for t in summary.get("test_sets") or []]
    for b in backbones:
        names += [n for n in summary[b].get("bleu_per_seed_by_test_set") or {} if n not in names]
    return names
