"""Training and scoring runs: one run (``run_one``), many at once (``train_all``) and the
records every study stores about them (``recipe_record``, ``machine_description``).

Runs live in ``out/<backbone>/seed<k>/`` (studies add ``lr<lr>/`` or ``L<depth>/`` above
that) with their checkpoints, ``train.log``, ``generate.txt`` and ``result.json``; a
re-run with the same arguments reuses finished runs and resumes an interrupted one (see
``fairseq_runs.train_resumable``). ``jobs`` runs that many trainings at once (threads
split between them), which changes no result.
"""

import math
import os
import platform
from dataclasses import asdict

from realformer_nmt.errors import ConfigError

from .. import fairseq_runs
from .recipe import ENVIRONMENT, backbone_flags, check_environment, corpus_info, train_command
from .report import fmt


def run_one(data, references, backbone, recipe, seed, run_dir, residual_mode="sum", lr=None,
            env=None, log=print):
    """Train one backbone/seed in ``run_dir`` and score its best checkpoint; return the result.

    The result (``run_dir/result.json``) holds the training record of
    ``fairseq_runs.train_resumable`` plus ``bleu``, ``best_valid_loss``, ``sacrebleu``,
    ``signature``, ``train_seconds``, ``decode_seconds`` and ``checkpoint``. A diverged run is
    not decoded (its ``bleu`` is None). Training and decoding run with the data fixes on
    (``recipe.ENVIRONMENT``, recorded as ``environment``).
    """
    env = fairseq_runs.with_data_fixes(env or fairseq_runs.cli_env())
    label = f"[{backbone} seed {seed}{'' if lr is None else f' lr {lr:g}'}] "
    done = finished_run(data, backbone, recipe, seed, run_dir, residual_mode, lr)
    if done is not None:
        log(f"{label}already done: reusing {os.path.join(run_dir, 'result.json')}")
        return score_test_sets(done, data, recipe, env=env, log=log, label=label)
    cmd = train_command(data, backbone, recipe, seed, run_dir, residual_mode, lr)
    train = fairseq_runs.train_resumable(cmd, run_dir, label, log, recipe.max_update, env)
    checkpoint = os.path.join(run_dir, "checkpoint_best.pt")
    finite = [rec for rec in train["curve"] if math.isfinite(rec["loss"])]
    result = dict(train, backbone=backbone, seed=seed, lr=lr if lr is not None else recipe.lr,
                  train_seconds=train["seconds"],
                  best_valid_loss=min(rec["loss"] for rec in finite) if finite else None,
                  final_valid_loss=train["curve"][-1]["loss"] if train["curve"] else None,
                  bleu=None, sacrebleu=None, signature=None, decode_seconds=None,
                  checkpoint=os.path.abspath(checkpoint), environment=dict(ENVIRONMENT))
    if recipe.select_by_bleu:
        bleus = [rec["bleu"] for rec in train["curve"] if "bleu" in rec]
        result["best_valid_bleu"] = max(bleus) if bleus else None
    if train["status"] == "finished" and os.path.exists(checkpoint):
        scored = fairseq_runs.generate_and_score(
            data, checkpoint, references, os.path.join(run_dir, "generate.txt"),
            recipe.generate_flags(corpus_info(data)), log=log, label=label, env=env,
            convention=corpus_info(data)["bleu"], lang=corpus_info(data)["tgt"])
        result.update(bleu=scored["bleu"], sacrebleu=scored["sacrebleu"], signature=scored["signature"],
                      bleu_convention=scored["convention"], tokenized_bleu=scored.get("tokenized_bleu"),
                      decode_seconds=scored["seconds"], generate_command=scored["command"])
    fairseq_runs.write_json(os.path.join(run_dir, "result.json"), fairseq_runs.finite_or_none(result))
    result = score_test_sets(dict(result, run_dir=run_dir), data, recipe, env=env, log=log, label=label)
    log(f"{label}DONE: {train['status']}{' (' + train['reason'] + ')' if train['reason'] else ''}, "
        f"updates {train['updates']}, best valid loss {fmt(result['best_valid_loss'])}, "
        f"test BLEU {fmt(result['bleu'])}, train {train['seconds']:.0f}s")
    return dict(fairseq_runs.finite_or_none(result), run_dir=run_dir)


def test_set_scores(result, data):
    """``{name: {"split", "bleu", "sacrebleu", "signature", ...}}``: a run's scores on the test
    sets of ``data`` (``recipe.corpus_info``'s ``test_sets``); the headline set is the run's own
    ``bleu`` where the run was scored before the test sets were named."""
    scores = dict(result.get("test_set_scores") or {})
    headline = corpus_info(data)["test_sets"][0]
    if result.get("bleu") is not None and headline["name"] not in scores:
        scores[headline["name"]] = {"split": "test", "bleu": result["bleu"], "sacrebleu": result.get("sacrebleu"),
                                    "signature": result.get("signature"),
                                    "decode_seconds": result.get("decode_seconds")}
    return scores


def missing_test_sets(result, data):
    """The test sets of ``data`` (beyond the headline) that a finished, decoded run has no score
    for: ``[{"split", "name", "references"}]``."""
    if result is None or result.get("status") != "finished" or result.get("bleu") is None:
        return []
    have = result.get("bleu_by_test_set") or {}
    return [t for t in corpus_info(data)["test_sets"][1:] if t["name"] not in have]


def score_test_sets(result, data, recipe, env=None, log=print, label=""):
    """Decode a finished run's ``checkpoint_best.pt`` on every test set of ``data`` it has no
    score for (``missing_test_sets``; fairseq-generate on that split, output in
    ``generate_<name>.txt``), store ``bleu_by_test_set`` and ``test_set_scores`` in its
    ``result.json`` and return the updated result. Decoding only: nothing trains. A run
    without its checkpoint (taken from a results file, or whose folder was cleaned) keeps
    what it has."""
    todo = missing_test_sets(result, data)
    run_dir = result["run_dir"]
    checkpoint = os.path.join(run_dir, "checkpoint_best.pt")
    if not todo or not os.path.exists(checkpoint):
        if todo and not result.get("imported_from"):
            log(f"{label}no {checkpoint}: {', '.join(t['name'] for t in todo)} cannot be scored")
        return result
    info = corpus_info(data)
    env = fairseq_runs.with_data_fixes(env or fairseq_runs.cli_env())
    scores = test_set_scores(result, data)
    for t in todo:
        scored = fairseq_runs.generate_and_score(
            data, checkpoint, t["references"], os.path.join(run_dir, f"generate_{t['name']}.txt"),
            recipe.generate_flags(info), subset=t["split"], log=log, label=f"{label}{t['name']}: ", env=env,
            convention=info["bleu"], lang=info["tgt"])
        scores[t["name"]] = {"split": t["split"], "bleu": scored["bleu"], "sacrebleu": scored["sacrebleu"],
                             "signature": scored["signature"], "sentences": scored["sentences"],
                             "decode_seconds": scored["seconds"], "references": os.path.abspath(t["references"]),
                             "generate_command": scored["command"]}
    result = dict(result, test_set_scores=scores,
                  bleu_by_test_set={name: rec["bleu"] for name, rec in scores.items()})
    stored = {k: v for k, v in result.items() if k != "run_dir"}
    fairseq_runs.write_json(os.path.join(run_dir, "result.json"), fairseq_runs.finite_or_none(stored))
    return result


def finished_run(data, backbone, recipe, seed, run_dir, residual_mode="sum", lr=None):
    """The stored result of a run that finished (trained, and decoded unless it diverged) with
    exactly this recipe in ``run_dir``, or None."""
    done = fairseq_runs.read_json(os.path.join(run_dir, "result.json"))
    cmd = train_command(data, backbone, recipe, seed, run_dir, residual_mode, lr)
    if done is not None and fairseq_runs.same_recipe(done.get("command"), cmd):
        check_environment(done, os.path.join(run_dir, "result.json"))
        return dict(done, run_dir=run_dir, **_files_where_the_folder_is(done, run_dir))
    return None


def _files_where_the_folder_is(done, run_dir):
    """A run trained here names its checkpoint and log by the absolute path its folder had
    then; read from a folder copied or moved since (a report run from another folder), they
    are named where the folder is now, so that the report writes them relative to it and not
    as another machine's or folder's paths. A run imported from a results file keeps the
    paths the file records."""
    if done.get("imported_from") is not None:
        return {}
    moved = {}
    for key, name in (("checkpoint", "checkpoint_best.pt"), ("log", "train.log")):
        recorded = done.get(key)
        if isinstance(recorded, str) and os.path.isabs(recorded) and os.path.basename(recorded) == name:
            moved[key] = os.path.abspath(os.path.join(run_dir, name))
    return moved


def run_hypotheses(result, test_set=None):
    """The detokenized test hypotheses of a scored run, in corpus order (None if not decoded);
    ``test_set``: those of a further test set (``generate_<name>.txt``)."""
    if test_set is not None:
        path = os.path.join(result["run_dir"], f"generate_{test_set}.txt")
        if (result.get("bleu_by_test_set") or {}).get(test_set) is None or not os.path.exists(path):
            return None
        hyps = fairseq_runs.parse_generate_output(fairseq_runs.read_log(path))
        return [hyps[i] for i in range(len(hyps))]
    path = os.path.join(result["run_dir"], "generate.txt")
    imported = os.path.join(result["run_dir"], "hypotheses.txt")  # a run taken from a results file
    if result.get("bleu") is None:
        return None  # not decoded
    if result.get("hypotheses") is not None:  # a results file's run, read into memory (--report-only)
        return list(result["hypotheses"])
    if not os.path.exists(path):
        return read_lines(imported) if os.path.exists(imported) else None
    hyps = fairseq_runs.parse_generate_output(fairseq_runs.read_log(path))
    return [hyps[i] for i in range(len(hyps))]


def save_hypotheses(results, folder):
    """Copy each decoded run's hypotheses (corpus order) to ``folder/<backbone>_seed<k>.txt``,
    so the BLEU scores and paired tests can be checked from the repository alone."""
    os.makedirs(folder, exist_ok=True)
    for r in results:
        hyps = run_hypotheses(r)
        if hyps is not None:
            with open(os.path.join(folder, f"{r['backbone']}_seed{r['seed']}.txt"), "w", encoding="utf-8") as f:
                f.write("".join(h + "\n" for h in hyps))
        for name in list(r.get("bleu_by_test_set") or {})[1:]:  # further test sets: <backbone>_seed<k>.<name>.txt
            hyps = run_hypotheses(r, name)
            if hyps is not None:
                with open(os.path.join(folder, f"{r['backbone']}_seed{r['seed']}.{name}.txt"), "w",
                          encoding="utf-8") as f:
                    f.write("".join(h + "\n" for h in hyps))


def machine_description(note=""):
    import torch

    try:
        import fairseq
        fairseq_version = fairseq.__version__
    except Exception:  # pragma: no cover - fairseq always imports here
        fairseq_version = "?"
    desc = (f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
            f"fairseq {fairseq_version}")
    if torch.cuda.is_available():
        desc += f", GPU {torch.cuda.get_device_name(0)}"
    return desc + (f"; {note}" if note else "")


def recipe_record(recipe, data, references, backbones, residual_mode, seeds):
    example = train_command(data, backbones[0], recipe, seeds[0], "<run_dir>", residual_mode)
    return {
        "settings": asdict(recipe),
        "shared_train_flags": recipe.model_flags(corpus_info(data)) + recipe.train_flags(),
        "backbone_flags": {b: backbone_flags(b, residual_mode) for b in backbones},
        "generate_flags": recipe.generate_flags(corpus_info(data)),
        "corpus": {k: v for k, v in corpus_info(data).items() if k not in ("references", "title", "test_sets")},
        "example_train_command": fairseq_runs.quote(example),
        "environment": dict(ENVIRONMENT),
        "seeds": list(seeds),
        "data": os.path.abspath(data),
        "references": os.path.abspath(references),
        "scoring": fairseq_runs.BLEU_CONVENTIONS[fairseq_runs.check_convention(corpus_info(data)["bleu"])]
                   + f" (fairseq-generate --remove-bpe {corpus_info(data)['bpe']}); best checkpoint by "
                   + ("validation BLEU" if recipe.select_by_bleu else "validation loss"),
    }


def check_backbones(backbones):
    if not backbones:
        raise ConfigError("--backbones: give at least one backbone")
    for b in backbones:
        backbone_flags(b)
    if len(set(backbones)) != len(backbones):
        raise ConfigError("--backbones: a backbone is listed twice")


def train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, tag, report_only=False):
    """Train and score every ``(key, backbone, seed, run_dir, recipe_or_None, lr)`` in ``specs``,
    ``jobs`` at a time; returns ``{key: result}``. With ``report_only`` nothing trains: the
    result of each run finished so far, None for the others."""
    threads = fairseq_runs.threads_per_job(threads, jobs)
    env = fairseq_runs.cli_env(threads)
    log = fairseq_runs.serialized(log)
    if report_only:
        runs = {spec[0]: finished_run(data, spec[1], spec[4] or recipe, spec[2], spec[3], residual_mode, spec[5])
                for spec in specs}
        log(f"[{tag}] report only: {sum(r is not None for r in runs.values())}/{len(specs)} runs finished")
        # decoding only: finished runs scored on the test sets they lack (their checkpoints still there)
        todo = [(spec, runs[spec[0]]) for spec in specs if missing_test_sets(runs[spec[0]], data)
                and os.path.exists(os.path.join(spec[3], "checkpoint_best.pt"))]
        if todo:
            log(f"[{tag}] report only: decoding {len(todo)} finished runs on the test sets they lack (no training)")

            def score(spec, result):
                label = f"[{spec[1]} seed {spec[2]}{'' if spec[5] is None else f' lr {spec[5]:g}'}] "
                return lambda: score_test_sets(result, data, spec[4] or recipe, env=env, log=log, label=label)

            runs.update(fairseq_runs.run_parallel([(spec[0], score(spec, r)) for spec, r in todo], jobs, log))
        return runs
    done = []

    def task(key, backbone, seed, run_dir, run_recipe, lr):
        def run():
            result = run_one(data, references, backbone, run_recipe or recipe, seed, run_dir, residual_mode,
                             lr=lr, env=env, log=log)
            done.append(key)
            log(f"[{tag}] finished {len(done)}/{len(specs)}: {backbone} seed {seed}"
                + (f" lr {lr:g}" if lr is not None else "") + f" ({result['status']})")
            return result
        return run

    return fairseq_runs.run_parallel([(spec[0], task(*spec)) for spec in specs], jobs, log)


def done_and_missing(runs, fields):
    """``{"done": [...], "missing": [...]}``: each run's key as a record (``fields`` name the
    key's parts), finished or not; a re-run with the same arguments trains the missing ones."""
    record = {"done": [], "missing": []}
    for key, result in runs.items():
        record["done" if result is not None else "missing"].append(dict(zip(fields, key)))
    return record


def parallel_note(jobs, threads, report_only=False, runs=None):
    """What the machine field says about concurrency and threads (the threads change a run's
    float rounding, so a rerun is exact only with the same threads on the same kind of CPU).
    ``report_only``: the command trained nothing, so its own ``--jobs``/``--threads`` say
    nothing about the runs; ``runs`` (finished run records): the threads each run recorded
    for its attempts (``machines``), which is what trained them."""
    if report_only:
        note = "report only: the command that wrote this trained nothing"
    else:
        threads = fairseq_runs.threads_per_job(threads, jobs)
        per_run = f"OMP_NUM_THREADS={threads}" if threads else "default threads"
        note = (f"one run at a time ({per_run})" if jobs == 1
                else f"--jobs {jobs}: {jobs} fairseq trainings at once, {per_run} each")
    if runs is None:
        return note
    runs = [r for r in runs if r is not None]
    recorded = sorted({m["threads"] for r in runs for m in r.get("machines") or [] if m.get("threads")})
    unrecorded = sum(1 for r in runs if not any(m.get("threads") for m in r.get("machines") or []))
    why = "taken from a results file, which keeps no threads per run, or trained before runs recorded them"
    if recorded:
        note += (f"; threads the runs recorded: OMP_NUM_THREADS={' or '.join(map(str, recorded))}"
                 + (f" ({unrecorded} of {len(runs)} runs record none: {why})" if unrecorded else ""))
    elif runs:
        note += f"; the runs record no threads ({why})"
    return note


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def join_notes(*notes):
    return "; ".join(n for n in notes if n)
