"""The ``train`` and ``ddp`` sections: ``fairseq-train`` on the demo corpus for each precision
and kernel, its checkpoint decoded with ``fairseq-generate``; each fp32 checkpoint evaluated
in fp16 / bf16 against vanilla's own shift; two ranks that must end with equal parameters."""

import concurrent.futures
import math
import os
import signal
import subprocess
import sys
import time

from .. import distributed_runs, fairseq_runs
from .records import check, portable, rel
from .settings import DDP_EXIT_SECONDS, PRECISION_SHIFT_FACTOR, PRECISION_SHIFT_FLOOR, PRECISIONS, REPO, USER_DIR

DONE = "done training"


def falling(losses) -> bool:
    """Finite, and the later half's mean below the first logged loss (one batch's loss is noisy)."""
    later = losses[len(losses) // 2:]
    return len(losses) >= 2 and all(math.isfinite(x) for x in losses) and sum(later) / len(later) < losses[0]


def train_command(s, save_dir, precision, kernel, updates, dry_run, seed=1, extra=()):
    arch = ["--arch", "transformer"] if kernel == "vanilla" else [
        "--arch", "realformer_transformer", "--residual-attention-kernel", kernel]
    return [*fairseq_runs.fairseq_cli("fairseq-train"), s.data, "--user-dir", USER_DIR, *arch, *s.model_flags,
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", str(s.warmup_updates), "--dropout", "0.1",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", str(s.max_tokens), "--max-update", str(updates), "--seed", str(seed),
            "--log-format", "simple", "--log-interval", str(s.log_interval), "--no-epoch-checkpoints",
            "--save-dir", save_dir, *PRECISIONS[precision], *extra] + (["--cpu"] if dry_run else [])


def train_one(run, precision, kernel, sentences, deadline):
    """One ``fairseq-train`` run (resumable) and its decoding, stopped at ``deadline``."""
    name = f"{precision}/{kernel}"
    run_dir = os.path.join(run.work, "train", f"{precision}-{kernel}")
    cmd = train_command(run.sizes, run_dir, precision, kernel, run.sizes.train_updates, run.dry_run)
    details = dict(precision=precision, kernel=kernel, command=portable(cmd), log=rel(os.path.join(run_dir,
                                                                                                 "train.log")))
    try:
        record = fairseq_runs.train_resumable(cmd, run_dir, label=f"[{name}] ", log=run.log,
                                              max_update=run.sizes.train_updates, env=run.env(),
                                              timeout=max(1.0, deadline - time.time()))
    except fairseq_runs.RunError as exc:
        return check(name, "failed", str(exc).splitlines()[0], **details)
    train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(
        fairseq_runs.read_log(os.path.join(run_dir, "train.log")))["train"]]
    curve = record["curve"][-1] if record["curve"] else {}
    details.update(updates=record["updates"], seconds=record["seconds"], train_losses=train,
                   valid_loss=curve.get("loss"), checkpoint=os.path.join(run_dir, "checkpoint_last.pt"))
    problems = [] if record["status"] == "finished" else [f"diverged: {record['reason']}"]
    losses = [x for _, x in train]
    if record["updates"] != run.sizes.train_updates:
        problems.append(f"{record['updates']} of {run.sizes.train_updates} updates")
    if not falling(losses):
        problems.append(f"training loss not finite and falling: {[round(x, 3) for x in losses]}")
    details["generate"] = generate_one(run, run_dir, sentences, deadline)
    if details["generate"]["status"] != "passed":
        problems.append(f"decoding: {details['generate']['reason']}")
    return check(name, "failed" if problems else "passed", "; ".join(problems) or None, **details)


def generate_one(run, run_dir, sentences, deadline):
    """``fairseq-generate`` on the checkpoint (``--fp16`` on CUDA): a hypothesis per test sentence."""
    cmd = [*fairseq_runs.fairseq_cli("fairseq-generate"), run.sizes.data, "--user-dir", USER_DIR,
           "--path", os.path.join(run_dir, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4",
           "--batch-size", "64", "--max-len-a", "1.5", "--max-len-b", "10", "--remove-bpe", "sentencepiece",
           *(["--cpu"] if run.dry_run else ["--fp16"])]
    out_path = os.path.join(run_dir, "generate.txt")
    result = dict(command=portable(cmd), output=rel(out_path))
    with open(out_path, "w", encoding="utf-8") as out:
        try:
            code = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=run.env(),
                                  timeout=max(1.0, deadline - time.time())).returncode
        except subprocess.TimeoutExpired:
            return dict(result, status="failed", reason="stopped at the section's deadline")
    lines = fairseq_runs.read_log(out_path)
    hyps = len(fairseq_runs.parse_generate_output(lines))
    bleu = [line.split(" | ")[-1] for line in lines if "Generate test with beam=" in line]
    result.update(hypotheses=hyps, sentences=sentences, bleu_line=bleu[-1] if bleu else None, status="passed",
                  reason=None)
    if code != 0 or hyps != sentences:
        result.update(status="failed", reason=f"exit code {code}, {hyps} hypotheses for {sentences} sentences")
    return result


def valid_nll(checkpoint, data, dtype, device):
    """The checkpoint's mean token nll (base 2, as fairseq logs ``nll_loss``) on the validation
    set, the whole model cast to ``dtype`` (as ``--fp16`` / ``--bf16`` run it)."""
    import torch
    from fairseq import checkpoint_utils, utils

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].to(device=device, dtype=getattr(torch, dtype)).eval()
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=4096, ignore_invalid_inputs=False,
                                  max_positions=utils.resolve_max_positions(task.max_positions(),
                                                                            model.max_positions()),
                                  seed=1).next_epoch_itr(shuffle=False)
    pad, total, tokens = task.target_dictionary.pad(), 0.0, 0
    with torch.no_grad():
        for sample in itr:
            sample = utils.move_to_cuda(sample) if device != "cpu" else sample
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).float()
            nll = -lprobs.gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)
            mask = sample["target"].ne(pad)
            total, tokens = total + float(nll[mask].double().sum()), tokens + int(mask.sum())
    return total / max(tokens, 1) / math.log(2)


def shift_checks(checkpoints, data, device, log=print):
    """Each fp32 checkpoint evaluated in float16 and bfloat16: its valid nll's relative shift
    from float32 within ``max(0.5%, 1.5x vanilla's)`` (``{kernel: path}``, vanilla among them)."""
    nll = {k: {d: valid_nll(p, data, d, device) for d in ("float32", "float16", "bfloat16")}
           for k, p in checkpoints.items()}
    checks = []
    for dtype in ("float16", "bfloat16"):
        shift = {k: abs(v[dtype] - v["float32"]) / v["float32"] for k, v in nll.items()}
        for kernel, value in shift.items():
            name = f"{dtype} evaluation of the fp32 checkpoint ({kernel})"
            if kernel == "vanilla" or "vanilla" not in shift:
                why = "yardstick" if kernel == "vanilla" else "vanilla's checkpoint is missing: not judged"
                checks.append(check(name, "reported", why, kernel=kernel, dtype=dtype, shift=value))
                continue
            limit = max(PRECISION_SHIFT_FLOOR, PRECISION_SHIFT_FACTOR * shift["vanilla"])
            ok = value <= limit
            why = f"shift {100 * value:.3f}% > {100 * limit:.3f}% (vanilla {100 * shift['vanilla']:.3f}%)"
            checks.append(check(name, "passed" if ok else "failed", None if ok else why,
                                kernel=kernel, dtype=dtype, shift=value, limit=limit, vanilla_shift=shift["vanilla"]))
        log(f"train: {dtype} shifts: " + ", ".join(f"{k} {100 * v:.3f}%" for k, v in shift.items()))
    return checks


def train_section(run, deadline):
    summary = run.ensure_data()
    sentences = summary["counts"]["test"]
    jobs = [(p, k) for p in run.sizes.train_precisions for k in run.sizes.train_kernels]
    eval_reserve = 20 if not run.dry_run else 0
    with concurrent.futures.ThreadPoolExecutor(run.sizes.jobs) as pool:
        checks = list(pool.map(lambda j: train_one(run, j[0], j[1], sentences, deadline - eval_reserve), jobs))
    fp32 = {c["kernel"]: c["checkpoint"] for c in checks if c["precision"] == "fp32" and c["status"] == "passed"}
    if len(fp32) > 1 and time.time() < deadline:
        checks += shift_checks(fp32, run.sizes.data, run.device, run.log)
    return checks


# ---------------------------------------------------------------------------------------
# two ranks
# ---------------------------------------------------------------------------------------


def run_ranks(commands, logs, env, limit, exit_seconds=DDP_EXIT_SECONDS, poll=0.2, clock=time.time,
              popen=subprocess.Popen):
    """Start every rank; stop them ``exit_seconds`` after rank 0 logged "done training" (a slow
    exit) or at ``limit`` seconds (SIGABRT first: ``PYTHONFAULTHANDLER`` prints the stacks).
    Returns ``{"returncodes", "seconds", "done_at", "stopped"}``."""
    start, done_at, stopped = clock(), None, None
    procs = []
    for cmd, log in zip(commands, logs):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env))
    while any(p.poll() is None for p in procs):
        now = clock()
        if done_at is None and os.path.exists(logs[0]) and DONE in open(logs[0], errors="replace").read():
            done_at = now
        if (done_at is not None and now - done_at > exit_seconds) or now - start > limit:
            stopped = "slow exit" if done_at is not None else "time limit"
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGABRT)
            time.sleep(min(poll * 10, 2.0))
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(poll)
    codes = [p.wait() for p in procs]
    return {"returncodes": codes, "seconds": round(clock() - start, 1), "stopped": stopped,
            "done_at": None if done_at is None else round(done_at - start, 1)}


def ddp_section(run, deadline):
    """Two ranks (gloo: NCCL refuses two ranks on one device), ``pytorch_ddp``, every rank
    saving its own checkpoint: both at ``--max-update``, parameters equal bit for bit."""
    import torch
    from fairseq import checkpoint_utils

    run.ensure_data()
    precision = "fp32" if run.dry_run else "fp16"
    run_dir = os.path.join(run.work, "ddp")
    saves = [os.path.join(run_dir, f"rank{r}") for r in range(2)]
    for d in saves:
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
    updates = run.sizes.ddp_updates
    cmd = train_command(run.sizes, saves[0], precision, "triton" if not run.dry_run else "bias", updates,
                        run.dry_run, extra=["--ddp-backend", "pytorch_ddp"])
    cmd = [sys.executable, "-m", "realformer_tools.experiments.every_rank_saves"] + fairseq_runs.fairseq_part(cmd)[1:]
    i = cmd.index("--save-dir")
    commands = [cmd[:i + 1] + [saves[r]] + cmd[i + 2:] + distributed_runs.rank_flags(r, 2) for r in range(2)]
    env = distributed_runs.rank_env(distributed_runs.free_port(), 2, run.env())
    env.update(PYTHONFAULTHANDLER="1", PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p))
    logs = [os.path.join(run_dir, f"rank{r}.log") for r in range(2)]
    result = run_ranks(commands, logs, env, max(10.0, deadline - time.time()))
    lines = fairseq_runs.read_log(logs[0])
    losses = [r["loss"] for r in fairseq_runs.parse_log(lines)["train"]]
    devices = [int(m.group(1)) for line in lines for m in [distributed_runs.TRAINING_ON.search(line)] if m]
    details = dict(precision=precision, backend="pytorch_ddp", command=portable(commands[0]),
                   logs=[rel(p) for p in logs], train_losses=losses, devices=devices[-1] if devices else None, **result)
    problems = [] if result["stopped"] != "time limit" else ["stopped at the section's deadline (stacks in the logs)"]
    if details["devices"] != 2:
        problems.append(f"rank 0 trained on {details['devices']} devices, not 2")
    if not falling(losses):
        problems.append(f"training loss not finite and falling: {losses}")
    states = []
    for r, save in enumerate(saves):
        try:
            state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
        except Exception as exc:  # any load failure is what this check reports
            problems.append(f"rank {r}: no checkpoint ({str(exc).splitlines()[0][:150]})")
            continue
        if state["optimizer_history"][-1]["num_updates"] != updates:
            problems.append(f"rank {r}: checkpoint after {state['optimizer_history'][-1]['num_updates']} updates")
        states.append(state["model"])
    if len(states) == 2:
        differ = [n for n in states[0] if not torch.equal(states[0][n], states[1].get(n, torch.empty(0)))]
        details.update(parameters_equal=not differ, tensors_compared=len(states[0]))
        if differ:
            problems.append(f"parameters differ between the ranks in {len(differ)} tensors (first: {differ[0]})")
    checks = [check(f"two ranks ({precision}, gloo, pytorch_ddp)", "failed" if problems else "passed",
                    "; ".join(problems) or None, **details)]
    if result["stopped"] == "slow exit":
        checks.append(check("two ranks: exit after training", "reported", f"a rank was still running "
                            f"{DDP_EXIT_SECONDS}s after rank 0 logged '{DONE}' and was stopped: a slow exit, not a "
                            "failure to train"))
    return checks
