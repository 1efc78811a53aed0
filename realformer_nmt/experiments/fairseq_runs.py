"""Run fairseq's command-line tools for an experiment and read back what they did.

The machinery every backbone comparison shares (translation here; a masked-LM comparison
uses the same pieces with its own evaluation):

- ``train_resumable``: one ``fairseq-train`` run in its own folder. Its output is appended
  to ``train.log`` while progress lines (with an ETA) are echoed; a finished run leaves
  ``train.json`` and is skipped when asked again with the same command; an interrupted
  one is restarted with the same command and fairseq resumes it from
  ``checkpoint_last.pt``. A run that blows up (NaN/inf gradients, fp16 loss scale at its
  minimum) is recorded as diverged instead of raising.
- ``parse_log`` / ``valid_curve``: the ``valid on 'valid' subset`` lines of a fairseq log
  (``--log-format simple``) as ``{"update": n, "loss": x, <every other number>}`` records,
  so a BLEU or an accuracy logged by the task comes along for free.
- ``generate_and_score``: ``fairseq-generate`` on a split, hypotheses put back in corpus
  order (fairseq prints them in batch order), and the corpus's BLEU convention
  (``BLEU_CONVENTIONS``): sacreBLEU against the raw references, or fairseq's tokenized
  BLEU as the headline with sacreBLEU of the detokenized output beside it.
"""

import concurrent.futures
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

from ..errors import ConfigError, RealFormerError

# the repository (or installed tree) holding the package: committed results name paths relative to it
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RunError(RealFormerError):
    """A fairseq tool failed for a reason other than divergence (the message names the log)."""


def fairseq_cli(name):
    """Path of a fairseq console script (``fairseq-train`` ...) installed next to this interpreter."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        raise RunError(f"{path} not found: run with the Python of the environment that has fairseq")
    return path


def resolve_fp16(device, fp16):
    """``--device`` checked; ``fp16`` None means on with cuda, off on cpu."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, not {device!r}")
    fp16 = device == "cuda" if fp16 is None else fp16
    if fp16 and device == "cpu":
        raise ConfigError("--fp16 needs --device cuda (fairseq's fp16 trainer is GPU-only)")
    return fp16


def quote(cmd):
    """A command as one copy-pasteable shell line."""
    return " ".join(shlex.quote(str(c)) for c in cmd)


def cli_env(threads=None):
    """Environment for the child tools: unbuffered output; ``threads`` sets OMP_NUM_THREADS."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def threads_per_job(threads, jobs):
    """OMP_NUM_THREADS for each of ``jobs`` concurrent runs: ``threads`` if given, else the
    machine's cores shared out (one each on a 2-core machine with ``--jobs 2``)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, not {jobs}")
    if threads:
        return threads
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def run_parallel(tasks, jobs=1, log=print):
    """Run ``tasks`` (``[(key, callable), ...]``, each one fairseq run or more) ``jobs`` at a
    time, in the given order; returns ``{key: result}``.

    Threads are enough: every task waits on fairseq subprocesses. Log lines of concurrent
    tasks are serialized. If a task fails, the tasks not yet started are cancelled, the
    running ones finish (their results are kept on disk, so a re-run reuses them) and the
    first error is raised.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, not {jobs}")
    if jobs == 1:
        return {key: task() for key, task in tasks}
    results, error = {}, None
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(task): key for key, task in tasks}
        for future in concurrent.futures.as_completed(futures):
            try:
                results[futures[future]] = future.result()
            except concurrent.futures.CancelledError:
                continue
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the running tasks end
                if error is None:
                    error = exc
                    for other in futures:
                        other.cancel()
    if error is not None:
        raise error
    return {key: results[key] for key, _ in tasks}


def serialized(log):
    """``log`` made safe to call from several threads (one line at a time)."""
    lock = threading.Lock()

    def locked(message):
        with lock:
            log(message)
    return locked


def portable(obj, root=None):
    """JSON-ready copy of ``obj`` whose strings name paths under ``root`` (default: the
    repository and the working directory, which the commands are run from) relative to it:
    committed results must not carry the paths of the machine they ran on."""
    roots = [root] if root is not None else [REPO, os.getcwd()]
    roots = sorted({os.path.abspath(r).rstrip(os.sep) for r in roots}, key=len, reverse=True)

    def strip(obj):
        if isinstance(obj, str):
            for r in roots:
                if obj == r:
                    return "."
                obj = obj.replace(r + os.sep, "")
            return obj
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [strip(v) for v in obj]
        return obj
    return strip(obj)


# --------------------------------------------------------------------------------------
# Reading fairseq logs
# --------------------------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|infinity)"
_PIPE_FIELD = re.compile(r"\| ([A-Za-z_]\w*) (" + _NUMBER + r")(?= \|)", re.IGNORECASE)
_EQ_FIELD = re.compile(r"\b([A-Za-z_]\w*)=(" + _NUMBER + r")(?=,|\s|$)", re.IGNORECASE)

DIVERGENCE_MARKERS = (
    ("gradients are Nan/Inf", "NaN/inf gradients (FloatingPointError)"),
    ("Minimum loss scale reached", "fp16 loss scale reached its minimum (loss exploding)"),
    ("FloatingPointError", "FloatingPointError"),
)


def _fields(line, marker):
    """``{name: float}`` of the numeric fields after ``marker`` in a simple-format line:
    ``| name value | ...`` (validation, end of epoch) or ``name=value, ...`` (train_inner)."""
    rest = line.split(marker, 1)[1]
    pairs = _EQ_FIELD.findall(rest) or _PIPE_FIELD.findall(" |" + rest.rstrip() + " |")
    return {name: float(value) for name, value in pairs}


def parse_log(lines, subset="valid"):
    """Validation records and training records of a ``--log-format simple`` fairseq-train log.

    Returns ``{"valid": [...], "train": [...]}``; each record is a dict of the numeric fields
    with ``update`` (``num_updates``) and ``loss``. Validation records are sorted by update,
    and a later record for the same update (a resumed run repeating one) replaces the earlier.
    """
    valid, train = {}, {}
    valid_marker = f"| valid on '{subset}' subset |"
    for line in lines:
        if valid_marker in line:
            rec = _fields(line, valid_marker)
            if "num_updates" in rec and "loss" in rec:
                valid[int(rec["num_updates"])] = rec
        elif "| train_inner |" in line:
            rec = _fields(line, "| train_inner |")
            if "num_updates" in rec and "loss" in rec:
                train[int(rec["num_updates"])] = rec
    def records(by_update):
        return [dict(rec, update=update) for update, rec in sorted(by_update.items())]
    return {"valid": records(valid), "train": records(train)}


def validate_record(lines, subset="valid"):
    """The numeric fields of ``fairseq-validate``'s summary line for ``subset`` (it has no
    ``num_updates``), or None."""
    marker = f"valid on '{subset}' subset |"
    found = [line for line in lines if marker in line]
    return _fields(found[-1].replace(marker, "| " + marker), "| " + marker) if found else None


def valid_curve(lines, metric="loss", subset="valid"):
    """``[[update, value], ...]`` of one validation metric (``loss``, ``bleu``, ``accuracy`` ...)."""
    return [[rec["update"], rec[metric]] for rec in parse_log(lines, subset)["valid"] if metric in rec]


def divergence_reason(lines):
    """Why a fairseq-train log shows a blown-up run (None if it does not).

    Divergence is an exception fairseq raises for non-finite gradients or a collapsed fp16
    loss scale, or a non-finite training/validation loss in the log.
    """
    text = "\n".join(lines)
    for needle, reason in DIVERGENCE_MARKERS:
        if needle in text:
            return reason
    parsed = parse_log(lines)
    for kind in ("train", "valid"):
        for rec in parsed[kind]:
            if not math.isfinite(rec["loss"]):
                return f"non-finite {kind} loss at update {rec['update']}"
    return None


def read_log(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------------------
# Running fairseq-train resumably
# --------------------------------------------------------------------------------------

_PROGRESS = re.compile(r"\| (train_inner|valid) \||done training|Stopping training|Loaded checkpoint|Error")


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def same_recipe(cmd_a, cmd_b):
    """Whether two commands train the same run: equal but for the tool's own path and the
    ``--user-dir`` location (a moved checkout or a frozen copy of the code still resumes)."""
    def key(cmd):
        cmd = [str(c) for c in (cmd or [])]
        out, skip = [os.path.basename(cmd[0])] if cmd else [], False
        for c in cmd[1:]:
            if skip:
                skip = False
                continue
            if c == "--user-dir":
                skip = True
                continue
            out.append(c)
        return out
    return key(cmd_a) == key(cmd_b)


_LOG_TIME = re.compile(r"^(?:### )?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def _log_times(log_path):
    """The local times (seconds since the epoch) stamped on the lines of ``log_path``."""
    times = []
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = _LOG_TIME.match(line)
                if m:
                    times.append(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")))
    except OSError:
        pass
    return times


def _attempt_seconds(attempts, log_path):
    """Wall seconds of all attempts. One killed without recording its end ends at the last
    line it logged: the log's last time stamp before the next attempt started (the log's
    mtime for the last attempt), so neither the time a killed run lay idle nor the next
    attempt's time is counted twice."""
    total, times = 0.0, None
    for i, att in enumerate(attempts):
        end = att.get("end")
        if end is None and i + 1 < len(attempts):
            times = _log_times(log_path) if times is None else times
            # stamps have whole seconds: the next attempt's own header is stamped floor(its start)
            before = [t for t in times if att["start"] - 1 <= t < math.floor(attempts[i + 1]["start"])]
            end = max(before) if before else att["start"]
        elif end is None:
            end = os.path.getmtime(log_path) if os.path.exists(log_path) else att["start"]
        total += max(0.0, end - att["start"])
    return total


def _eta(first, update, max_update):
    """`` | x upd/s, eta ..`` from ``first`` = (time, update) of this attempt's first logged update."""
    start, first_update = first
    if not max_update or update <= first_update:
        return ""
    rate = (update - first_update) / max(time.time() - start, 1e-6)
    left = max(0, max_update - update) / rate
    return f" | {rate:.2f} upd/s, eta {int(left // 60)}m{int(left % 60):02d}s"


def run_logged(cmd, log_path, label="", log=print, max_update=None, env=None):
    """Run ``cmd``, append its output to ``log_path`` and echo progress lines with an ETA.

    Returns ``(returncode, lines of this attempt)``.
    """
    lines, first = [], None
    with open(log_path, "a", encoding="utf-8", buffering=1) as out:
        out.write(f"### {time.strftime('%Y-%m-%d %H:%M:%S')} running: {quote(cmd)}\n")
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="replace", env=env or cli_env())
        try:
            for line in proc.stdout:
                out.write(line)
                line = line.rstrip("\n")
                lines.append(line)
                if _PROGRESS.search(line):
                    match = re.search(r"num_updates[= ](\d+)", line)
                    eta = ""
                    if match:
                        update = int(match.group(1))
                        first = first or (time.time(), update)
                        eta = _eta(first, update, max_update)
                    log(f"{label}{line.split(' | ', 3)[-1]}{eta}")
        finally:
            proc.wait()
    return proc.returncode, lines


def train_resumable(cmd, run_dir, label="", log=print, max_update=None, env=None):
    """Train once in ``run_dir`` (a ``--save-dir`` given in ``cmd``); return the run's record.

    The record (also ``run_dir/train.json``): ``status`` ("finished" or "diverged"),
    ``reason``, ``seconds`` (wall time over all attempts), ``updates``, ``curve`` (the
    validation records, see ``parse_log``), ``command`` and ``log``. A finished or diverged
    run with the same command is returned without training again; a different command in
    the same folder is refused (it would mix two runs).
    """
    os.makedirs(run_dir, exist_ok=True)
    marker, log_path = os.path.join(run_dir, "train.json"), os.path.join(run_dir, "train.log")
    attempts_path = os.path.join(run_dir, "attempts.json")
    command = [str(c) for c in cmd]
    done = read_json(marker)
    if done is not None:
        if not same_recipe(done.get("command"), command):
            raise RunError(f"{run_dir} holds a run made with a different command ({marker}); "
                           "use another --out, or delete that folder to retrain")
        return done
    attempts = read_json(attempts_path) or []
    if attempts and not same_recipe(attempts[0].get("command"), command):
        raise RunError(f"{run_dir} holds an unfinished run made with a different command "
                       f"({attempts_path}); use another --out, or delete that folder to retrain")
    if attempts:
        log(f"{label}resuming (fairseq continues from checkpoint_last.pt)")
    attempts.append({"command": command, "start": time.time(), "end": None})
    write_json(attempts_path, attempts)
    returncode, lines = run_logged(command, log_path, label, log, max_update, env)
    attempts[-1]["end"] = time.time()
    attempts[-1]["returncode"] = returncode
    write_json(attempts_path, attempts)

    all_lines = read_log(log_path)
    reason = divergence_reason(lines)
    if returncode != 0 and reason is None:
        tail = "\n".join(lines[-20:])
        raise RunError(f"fairseq-train failed with exit code {returncode} (log: {log_path}); last lines:\n{tail}")
    parsed = parse_log(all_lines)
    updates = [rec["update"] for rec in parsed["train"] + parsed["valid"]]
    record = {
        "status": "diverged" if reason else "finished",
        "reason": reason,
        "seconds": round(_attempt_seconds(attempts, log_path), 1),
        "attempts": len(attempts),
        "updates": max(updates) if updates else 0,
        "curve": parsed["valid"],
        "command": command,
        "log": os.path.abspath(log_path),
    }
    write_json(marker, record)
    return record


# --------------------------------------------------------------------------------------
# Aggregating runs
# --------------------------------------------------------------------------------------

def mean_curve(curves):
    """``[[update, mean, min, max], ...]`` over several runs' ``[[update, value], ...]`` curves, at the
    updates every run has (seeds of one recipe validate at the same updates)."""
    common = set.intersection(*(set(u for u, _ in c) for c in curves)) if curves else set()
    rows = []
    for update in sorted(common):
        values = [dict(c)[update] for c in curves]
        values = [v for v in values if v is not None]
        if values:
            rows.append([update, statistics.mean(values), min(values), max(values)])
    return rows


def finite_or_none(obj):
    """JSON-safe copy: NaN/inf become None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------
# Decoding and sacreBLEU
# --------------------------------------------------------------------------------------

def parse_generate_output(lines):
    """``{sentence id: detokenized hypothesis}`` from the ``D-<id>`` lines of fairseq-generate.

    fairseq prints sentences in batch order (sorted by length), not corpus order; the id
    is the line number in the split, which is how the caller restores the order.
    """
    hyps = {}
    for line in lines:
        match = re.match(r"D-(\d+)\t[^\t]*\t(.*)$", line)
        if match:
            hyps[int(match.group(1))] = match.group(2)
        elif re.match(r"D-(\d+)\t[^\t]*$", line):  # an empty hypothesis
            hyps[int(line.split("\t")[0][2:])] = ""
    return hyps


def parse_generate_targets(lines):
    """``{sentence id: reference}`` from the ``T-<id>`` lines of fairseq-generate: the
    binarized reference with the BPE removed, what its tokenized BLEU scores against."""
    refs = {}
    for line in lines:
        match = re.match(r"T-(\d+)\t(.*)$", line)
        if match:
            refs[int(match.group(1))] = match.group(2)
    return refs


def paired_test_references(result, references):
    """(references, sacreBLEU ``BLEU`` options) of a paired test on runs scored like
    ``result`` (a run record with ``bleu_convention`` and ``run_dir``): the raw
    ``references`` and sacreBLEU's defaults, or, for tokenized BLEU, the ``T-`` lines of
    the run's ``generate.txt`` in corpus order, untokenized further and unsmoothed
    (sacreBLEU then computes fairseq's tokenized BLEU, the headline)."""
    if result.get("bleu_convention", "sacrebleu") != "tokenized":
        return references, {}
    targets = parse_generate_targets(read_log(os.path.join(result["run_dir"], "generate.txt")))
    # no smoothing either: fairseq's BLEU is 0 when a precision is
    return [targets[i] for i in range(len(targets))], {"tokenize": "none", "smooth_method": "none", "force": True}


def sacrebleu_score(hypotheses, references, lowercase=False):
    """Corpus sacreBLEU (13a tokenization, cased unless ``lowercase``) of detokenized text:
    (score object, signature)."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
    result = bleu.corpus_score(hypotheses, [references])
    return result, str(bleu.get_signature())


# what prepare.json's "bleu" names -> which score is the headline, and why
BLEU_CONVENTIONS = {
    "sacrebleu": "headline: sacreBLEU (13a tokenization, cased) of the detokenized output against the raw "
                 "references, the comparable BLEU for corpora without a tokenized-BLEU tradition, such as Multi30k",
    "tokenized": "headline: fairseq-generate's tokenized BLEU (its default scorer, --scoring bleu) after "
                 "--remove-bpe, against the Moses-tokenized, lowercased references of the binarized test "
                 "set, because that is the BLEU IWSLT'14 De-En papers report (about 34.5-35 for "
                 "transformer_iwslt_de_en); beside it, sacreBLEU of the Moses-detokenized output against "
                 "the raw <seg> references, lowercased as the output is (signature recorded)",
}
BLEU_LABELS = {"sacrebleu": "sacreBLEU, detokenized, cased",
               "tokenized": "fairseq's tokenized BLEU after --remove-bpe, as IWSLT'14 papers report it; "
                            "lowercased sacreBLEU of the detokenized output in the JSON"}
_FAIRSEQ_BLEU = re.compile(r"Generate \S+ with beam=\d+: (BLEU\d* = ([-+\d.]+).*)$")


def check_convention(convention):
    if convention not in BLEU_CONVENTIONS:
        raise ConfigError(f"unknown BLEU convention {convention!r} in prepare.json (one of "
                          f"{', '.join(BLEU_CONVENTIONS)})")
    return convention


def fairseq_bleu(lines):
    """fairseq-generate's own score line (``BLEU4 = 34.85, 69.4/...``) as (text, score), or None."""
    for line in reversed(lines):
        match = _FAIRSEQ_BLEU.search(line)
        if match:
            return match.group(1), float(match.group(2))
    return None


def moses_detokenize(lines, lang):
    """``detokenizer.perl -l <lang>`` (sacremoses; unescapes ``&apos;`` and friends)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def score_hypotheses(lines, references, convention="sacrebleu", lang=None):
    """Score fairseq-generate's output ``lines`` by ``convention`` against the raw ``references``.

    ``sacrebleu``: sacreBLEU of the ``D-`` lines. ``tokenized``: fairseq's printed tokenized
    BLEU is the headline; the ``D-`` lines (tokenized, BPE removed) are Moses-detokenized
    (``lang``: the target language) and scored with lowercased sacreBLEU beside it. Returns
    ``{"bleu", "convention", "headline", "sacrebleu", "sacrebleu_score", "signature"}`` (and
    ``tokenized_bleu``: fairseq's line).
    """
    check_convention(convention)
    hyps = parse_generate_output(lines)
    if sorted(hyps) != list(range(len(references))):
        raise RunError(f"fairseq-generate returned {len(hyps)} hypotheses for {len(references)} references")
    ordered = [hyps[i] for i in range(len(references))]
    out = {"convention": convention, "headline": BLEU_CONVENTIONS[convention]}
    if convention == "sacrebleu":
        result, signature = sacrebleu_score(ordered, references)
        return dict(out, bleu=round(result.score, 2), sacrebleu=str(result), sacrebleu_score=round(result.score, 2),
                    signature=signature)
    found = fairseq_bleu(lines)
    if found is None:
        raise RunError("fairseq-generate printed no BLEU line: tokenized BLEU needs its default scorer "
                       "(no --scoring sacrebleu) on a split with targets")
    result, signature = sacrebleu_score(moses_detokenize(ordered, lang or "en"), references, lowercase=True)
    return dict(out, bleu=round(found[1], 2), tokenized_bleu=found[0], sacrebleu=str(result),
                sacrebleu_score=round(result.score, 2), signature=signature)


def generate_and_score(data, checkpoint, references, out_path, extra_args=(), subset="test",
                       log=print, label="", env=None, convention="sacrebleu", lang=None):
    """Beam-search ``subset`` with ``checkpoint`` and score it against ``references``.

    ``references`` is a file of raw (untokenized, cased) target sentences in corpus order;
    ``extra_args`` must include ``--user-dir`` and the BPE to remove (``--remove-bpe
    sentencepiece``, ``--remove-bpe subword_nmt``, or ``--bpe sentencepiece
    --sentencepiece-model ...``). ``convention`` (prepare.json's ``bleu``) and ``lang``
    (the target language) choose the score, see ``score_hypotheses``. The output of
    fairseq-generate goes to ``out_path``. Returns ``score_hypotheses``'s dict plus
    ``sentences``, ``seconds``, ``command`` and ``output``.
    """
    check_convention(convention)
    args = [str(a) for a in extra_args]
    if convention == "tokenized" and "--scoring" in args and args[args.index("--scoring") + 1] != "bleu":
        raise ConfigError("tokenized BLEU is fairseq-generate's default scorer: drop --scoring")
    cmd = [fairseq_cli("fairseq-generate"), data, "--path", checkpoint, "--gen-subset", subset, *args]
    start = time.time()
    with open(out_path, "w", encoding="utf-8") as out:
        proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                              env=env or cli_env())
    seconds = time.time() - start
    lines = read_log(out_path)
    if proc.returncode != 0:
        tail = "\n".join(lines[-15:])
        raise RunError(f"fairseq-generate failed with exit code {proc.returncode} (output: {out_path}):\n{tail}")
    with open(references, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    try:
        scored = score_hypotheses(lines, refs, convention, lang)
    except RunError as exc:
        raise RunError(f"{exc} (references: {references}, output: {out_path})") from exc
    extra = "" if convention == "sacrebleu" else f", sacreBLEU {scored['sacrebleu_score']:.2f}"
    log(f"{label}test BLEU {scored['bleu']:.2f} ({convention}{extra}; {len(refs)} sentences, "
        f"decoded in {seconds:.0f}s)")
    return dict(scored, sentences=len(refs), seconds=round(seconds, 1), command=[str(c) for c in cmd],
                output=os.path.abspath(out_path))
