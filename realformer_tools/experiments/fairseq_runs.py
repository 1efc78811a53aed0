"""Run fairseq's command-line tools for an experiment and read back what they did.

The machinery every backbone comparison shares (translation; a masked-LM comparison uses
the same pieces with its own evaluation), one concept per module:

- ``fairseq_tools``: finding and starting the tools (``run_logged``: output appended to a
  log, progress echoed with an ETA; ``run_parallel``: several runs at once);
- ``fairseq_logs``: the training and validation records of a log (``parse_log``), which
  the harness writes with ``--log-format json``;
- ``fairseq_generate``: ``fairseq-generate`` on a split, scored by the corpus's BLEU
  convention (``generate_and_score``);
- here: ``train_resumable``, one ``fairseq-train`` run in its own folder. Its output is
  appended to ``train.log``; a finished run leaves ``train.json`` and is skipped when
  asked again with the same recipe (``same_recipe``); an interrupted one is restarted and
  fairseq resumes it from ``checkpoint_last.pt``. A run that blows up (NaN/inf gradients,
  fp16 loss scale at its minimum) is recorded as diverged instead of raising. Beside it,
  what results files need (``write_json``, ``portable``, ``finite_or_none``, ``mean_curve``).

The names of the other three modules are importable from here too, as callers did before
the split.
"""

import json
import math
import os
import platform
import re
import statistics
import time

from .fairseq_generate import (  # noqa: F401 - re-exported for callers
    BLEU_CONVENTIONS,
    BLEU_LABELS,
    check_convention,
    fairseq_bleu,
    generate_and_score,
    moses_detokenize,
    paired_test_references,
    parse_generate_output,
    parse_generate_targets,
    sacrebleu_score,
    score_hypotheses,
)
from .fairseq_logs import (  # noqa: F401 - re-exported for callers
    DIVERGENCE_MARKERS,
    divergence_reason,
    parse_log,
    read_log,
    stats_record,
    valid_curve,
    validate_record,
)
from .fairseq_tools import (  # noqa: F401 - re-exported for callers
    RunError,
    cli_env,
    fairseq_cli,
    fairseq_part,
    quote,
    resolve_fp16,
    run_logged,
    run_parallel,
    serialized,
    threads_per_job,
    with_data_fixes,
)

# the repository (or installed tree) holding the package: committed results name paths relative to it
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# flags whose value a recorded command may differ in and still be the same run: where the
# code lives, and how fairseq writes its log (committed runs were logged in ``simple``)
NOT_RECIPE = ("--user-dir", "--log-format")


def same_recipe(cmd_a, cmd_b):
    """Whether two commands train the same run: equal but for the tool's own path (and the
    launcher's words: ``fairseq_part``) and the values of ``NOT_RECIPE`` (a moved checkout or
    a frozen copy of the code still resumes; a run logged in ``simple`` format is the same run
    in ``json``)."""
    def key(cmd):
        cmd = fairseq_part(cmd or [])
        out, skip = [os.path.basename(cmd[0])] if cmd else [], False
        for c in cmd[1:]:
            if skip:
                skip = False
                continue
            if c in NOT_RECIPE:
                skip = True
                continue
            out.append(c)
        return out
    return key(cmd_a) == key(cmd_b)


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


def machine_record(env=None):
    """What decides a run's float rounding besides its command: the CPU's model name, the vector
    instructions torch's CPU kernels use (``ATEN_CPU_CAPABILITY`` in ``env`` lowers them) and
    ``OMP_NUM_THREADS`` (unset: torch's default, as this process has it), with torch's version.
    Changing any of them changes the last bits of a float32 training step
    (measured: gradients by up to 3e-5), and over a few hundred updates the validation loss in
    its third decimal; an exact rerun needs them all the same (docs/results.md)."""
    import torch

    env = os.environ if env is None else env
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    threads = str(env.get("OMP_NUM_THREADS", "")).strip()
    return {"cpu": model,
            "cpu_capability": env.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__,
            "threads": int(threads) if threads.isdigit() else torch.get_num_threads()}


def train_resumable(cmd, run_dir, label="", log=print, max_update=None, env=None, timeout=None):
    """Train once in ``run_dir`` (a ``--save-dir`` given in ``cmd``); return the run's record.

    The record (also ``run_dir/train.json``): ``status`` ("finished" or "diverged"),
    ``reason``, ``seconds`` (wall time over all attempts), ``updates``, ``curve`` (the
    validation records, see ``parse_log``), ``command``, ``log`` and ``machines`` (each attempt's
    ``machine_record``, once each: a run resumed elsewhere names both). A finished or diverged
    run with the same command is returned without training again; a different command in
    the same folder is refused (it would mix two runs). ``timeout``: seconds after which
    this attempt is killed (a ``RunError``; asked again, fairseq resumes it).
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
        if os.path.exists(os.path.join(run_dir, "checkpoint_last.pt")):
            log(f"{label}resuming (fairseq continues from checkpoint_last.pt)")
        else:
            log(f"{label}restarting from update 0 (the last attempt stopped before its first checkpoint)")
    attempts.append({"command": command, "start": time.time(), "end": None, "machine": machine_record(env)})
    write_json(attempts_path, attempts)
    returncode, lines = run_logged(command, log_path, label, log, max_update, env, timeout=timeout)
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
    machines = [a["machine"] for a in attempts if a.get("machine")]  # attempts before this field: unknown
    record = {
        "status": "diverged" if reason else "finished",
        "reason": reason,
        "seconds": round(_attempt_seconds(attempts, log_path), 1),
        "attempts": len(attempts),
        "resumes": resumes_in_log(all_lines),
        "updates": max(updates) if updates else 0,
        "curve": parsed["valid"],
        "command": command,
        "log": os.path.abspath(log_path),
        "machines": [m for i, m in enumerate(machines) if m not in machines[:i]],
    }
    write_json(marker, record)
    return record


_RESUMED = re.compile(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ [1-9]\d* updates\)")


def resumes_in_log(lines):
    """How many times a run continued from its own checkpoint_last.pt, as fairseq's log says
    (an attempt that found no checkpoint restarted from update 0 and is not counted)."""
    return sum(1 for line in lines if _RESUMED.search(line))


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
