"""Runs that a committed results file already holds, taken into a study's run folder instead
of being trained again (``compare_backbones.py --import-results FILE``).

A results JSON of the main comparison, of the depth stress test or of the stability grid keeps
every seed's record per backbone (test BLEU, best validation loss and the validation curve,
outcome, times; per learning rate in the grid) and,
for the main comparison, every run's test hypotheses in ``<stem>_hyps/``. When its recipe is
the one asked for (the same fairseq-train command but for the save dir, the same decode
flags, the same data dir name and the same backbone flags), each of its runs that the run
folder does not hold yet is written there as ``result.json`` (``imported_from`` names the
file), with its hypotheses as ``hypotheses.txt``. The study then counts it as finished: it is
reported, tested against the new runs of the same seed, and not trained again. A different
recipe is refused, naming the first flag that differs, and so is a file whose recipe records
``REALFORMER_NMT_DATA_FIXES`` off (``recipe.check_environment``; a file that records no
environment predates the switch, when the fixes were always on, and counts as on).

This is sound because fairseq's CPU training is reproducible on the same kind of machine with
the same threads: the same command gives the same run to the bit. On another CPU (or with
other threads) float rounding differs and a rerun is a slightly different run of the same seed,
as good as the imported one but not equal to it (docs/results.md, "Reproducibility across
machines", measures both).
"""

import os
import shlex
from dataclasses import replace

from realformer_nmt.errors import ConfigError, DataError

from .. import fairseq_runs
from .recipe import ENVIRONMENT, VARIANTS, backbone_flags, check_environment, corpus_info, train_command
from .stability import run_dir as grid_run_dir

STUDIES = ("compare", "depth", "stability")


def _normalized(cmd):
    """A fairseq command as compared here: tool name without its folder, the data dir's name,
    no ``--save-dir`` value nor those ``fairseq_runs.NOT_RECIPE`` leaves out (``--user-dir``,
    ``--log-format``: the committed runs were logged in ``simple`` format)."""
    cmd = fairseq_runs.fairseq_part(cmd)
    out = [os.path.basename(cmd[0]), os.path.basename(os.path.normpath(cmd[1]))] if len(cmd) > 1 else list(cmd)
    skip = False
    for c in cmd[2:]:
        if skip:
            skip = False
            continue
        if c == "--save-dir" or c in fairseq_runs.NOT_RECIPE:
            skip = True
            continue
        out.append(c)
    return out


def _first_difference(recorded, wanted):
    """The first place two normalized commands differ, named by its flag: ``--lr 0.001 where
    this run has --lr 0.0005``."""
    for i, (a, b) in enumerate(zip(recorded, wanted)):
        if a != b:
            flag = next((c for c in reversed(recorded[:i]) if c.startswith("--")), None) \
                if not a.startswith("--") and not b.startswith("--") else None
            a, b = (f"{flag} {a}", f"{flag} {b}") if flag else (a, b)
            return f"{a} where this run has {b}"
    longer, name = (recorded, "the file's") if len(recorded) > len(wanted) else (wanted, "this run's")
    return f"{name} command goes on: {' '.join(longer[min(len(recorded), len(wanted)):])}"


def _check_recipe(path, summary, data, recipe, residual_mode, depth):
    record = summary.get("recipe") or {}
    example = record.get("example_train_command")
    if not example:
        raise DataError(f"--import-results {path}: it records no example_train_command (not a results file of "
                        "the main comparison, the depth stress test or the stability grid)")
    check_environment(record, f"--import-results {path}")
    recorded = shlex.split(example)
    backbones = [b for b in record.get("backbone_flags", {})]
    if not backbones or backbones[0] not in VARIANTS:
        raise DataError(f"--import-results {path}: its recipe names no known backbone")
    seed = (record.get("seeds") or [1])[0]
    wanted = train_command(data, backbones[0], replace(recipe, layers=depth) if depth else recipe, seed,
                           "<run_dir>", residual_mode)
    if _normalized(recorded) != _normalized(wanted):
        raise ConfigError(f"--import-results {path}: its runs were trained with another recipe: "
                          f"{_first_difference(_normalized(recorded), _normalized(wanted))}")
    generate = recipe.generate_flags(corpus_info(data))
    if _normalized(["g", "d"] + record.get("generate_flags", [])) != _normalized(["g", "d"] + generate):
        raise ConfigError(f"--import-results {path}: its runs were decoded with other flags: "
                          f"{' '.join(record.get('generate_flags', []))}")


def _entries(summary, study):
    """``(depth or None, lr or None, backbone, entry)`` for every backbone record of the file
    (``lr`` only for the stability grid's cells)."""
    if study == "stability":
        if "grid" not in summary or "depth" not in summary:
            raise DataError("--import-results: not a stability grid results file (no 'grid'); with "
                            "--stability-limit give the grid's own results file (a depth stress file goes with "
                            "--depth-stress)")
        for lr, row in summary["grid"].items():
            for b, entry in row.items():
                if entry is not None:
                    yield int(summary["depth"]), float(lr), b, entry
        return
    if study == "depth":
        if "depths" not in summary:
            raise DataError("--import-results: not a depth stress results file (no 'depths'); "
                            "give it with --depth-stress, or a main comparison file without it")
        for depth, row in summary["depths"].items():
            for b, entry in row.items():
                if entry is not None:
                    yield int(depth), None, b, entry
        return
    if "depths" in summary or "grid" in summary:
        raise DataError("--import-results: a depth or grid results file; give a main comparison file "
                        "(or --depth-stress / --stability-limit with a file of that study)")
    for b, entry in summary.items():
        if b in VARIANTS and isinstance(entry, dict):
            yield None, None, b, entry


def run_records(path, data, out, recipe, residual_mode="sum", study="compare", depth=None):
    """``{run_dir: (result record, hypotheses or None)}`` for every run of the results file
    ``path`` (its recipe checked against ``recipe``; a grid's depth against ``depth`` when
    given); nothing is written."""
    if study not in STUDIES:
        raise ConfigError("--import-results applies to the main comparison, --depth-stress and --stability-limit, "
                          f"not {study}")
    summary = fairseq_runs.read_json(path)
    if not isinstance(summary, dict):
        raise DataError(f"--import-results {path}: no such results file, or not JSON")
    hyps_dir = os.path.splitext(path)[0] + "_hyps"
    convention = (summary.get("recipe", {}).get("corpus") or {}).get("bleu", "sacrebleu")
    entries = list(_entries(summary, study))
    # the file's example command has its first depth's layers (the depth test records it so; the
    # grid records its one depth at the recipe's own learning rate)
    if study == "stability":
        first_depth = int(summary["depth"])
        if depth is not None and int(depth) != first_depth:
            raise ConfigError(f"--import-results {path}: its grid is at {first_depth}+{first_depth} layers, "
                              f"this run has --depths {depth}")
    else:
        first_depth = min(d for d, _, _, _ in entries) if study == "depth" and entries else None
    _check_recipe(path, summary, data, recipe, residual_mode, first_depth)
    records = {}
    for layers, lr, b, entry in entries:
        if entry.get("flags") != backbone_flags(b, residual_mode):
            raise ConfigError(f"--import-results {path}: its {b} ran with {' '.join(entry.get('flags') or [])}, "
                              f"this recipe gives {' '.join(backbone_flags(b, residual_mode))}")
        run_recipe = replace(recipe, layers=layers) if layers else recipe
        base = os.path.join(out, f"L{layers}") if layers else out
        sources = entry.get("imported_from_per_seed") or [None] * len(entry["seeds"])
        for i, seed in enumerate(entry["seeds"]):
            run_dir = grid_run_dir(out, layers, lr, recipe.lr, b, seed) if lr is not None \
                else os.path.join(base, b, f"seed{seed}")
            curve = [{"update": u, "loss": loss} for u, loss in entry["curve_per_seed"][i]]
            per_seed = {k: (entry.get(f"{k}_per_seed") or [None] * len(entry["seeds"]))[i]
                        for k in ("sacrebleu", "reason", "attempts", "resumes")}
            bleu = entry["bleu_per_seed"][i]
            record = dict(
                backbone=b, seed=seed, lr=run_recipe.lr if lr is None else lr,
                status=entry["fairseq_status_per_seed"][i],
                reason=per_seed["reason"], updates=entry["updates"], curve=curve,
                best_valid_loss=entry["valid_loss_per_seed"][i],
                final_valid_loss=curve[-1]["loss"] if curve else None,
                bleu=bleu, sacrebleu=per_seed["sacrebleu"],
                signature=summary.get("sacrebleu_signature") if bleu is not None else None,
                bleu_convention=convention,
                seconds=entry["train_seconds_per_seed"][i], train_seconds=entry["train_seconds_per_seed"][i],
                attempts=per_seed["attempts"], resumes=per_seed["resumes"],
                decode_seconds=entry["decode_seconds_per_seed"][i],
                checkpoint=entry["checkpoints"][i], log=entry["logs"][i],
                command=train_command(data, b, run_recipe, seed, run_dir, residual_mode, lr),
                imported_from=sources[i] or path,  # where the run was first recorded
                environment=dict(ENVIRONMENT),  # checked against the file's recipe above
            )
            by_set = {name: values[i] for name, values in (entry.get("bleu_per_seed_by_test_set") or {}).items()
                      if values[i] is not None}
            if by_set:  # the test sets the run was scored on (the main comparison)
                record["bleu_by_test_set"] = by_set
            hyps_path = os.path.join(hyps_dir, f"{b}_seed{seed}.txt")
            hyps = None
            # hypotheses are kept per backbone and seed, so only the main comparison's files name one run
            if study == "compare" and bleu is not None and convention != "tokenized" and os.path.exists(hyps_path):
                with open(hyps_path, encoding="utf-8") as f:
                    hyps = f.read()
            records[run_dir] = (record, hyps)
    return records


def import_results(path, data, out, recipe, residual_mode="sum", study="compare", log=print, depth=None):
    """Write every run of ``path`` that ``out`` does not hold yet (see the module's text);
    returns the run folders written."""
    written = []
    for run_dir, (record, hyps) in run_records(path, data, out, recipe, residual_mode, study, depth).items():
        if os.path.exists(os.path.join(run_dir, "result.json")) or os.path.exists(
                os.path.join(run_dir, "checkpoint_last.pt")):
            continue  # trained (or training) here: never replaced
        os.makedirs(run_dir, exist_ok=True)
        if hyps is not None:
            with open(os.path.join(run_dir, "hypotheses.txt"), "w", encoding="utf-8") as f:
                f.write(hyps)
        fairseq_runs.write_json(os.path.join(run_dir, "result.json"), record)
        written.append(run_dir)
    log(f"[import] {len(written)} finished runs taken from {path} into {out}"
        + (f" ({', '.join(os.path.relpath(d, out) for d in written)})" if written else ""))
    return written
