"""The ``train`` step: ``fairseq-train`` on the demo corpus for each precision and kernel
(resumable, each run kept), then ``fairseq-generate`` on its checkpoint; also the
commands the ``ddp`` step and ``--quick`` train with."""

import concurrent.futures
import json
import math
import os
import subprocess
import time

from .. import fairseq_runs
from .records import _clear_run, check, portable, rel
from .settings import PRECISIONS, USER_DIR


class TrainStep:
    """``GpuCheck``'s ``train`` step and the training commands (uses its ``sizes``,
    ``work``, ``force``, ``dry_run``, ``jobs``, ``env`` and ``log``)."""

    def ensure_data(self):
        """The demo corpus (``make demo``'s, ``data-bin/demo_en_de``), prepared once."""
        from ...data import corpora

        s = self.sizes
        wanted = corpora.prepare_settings("synthetic", vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with self._lock:
            if corpora.prepared_settings(s.data) != wanted:
                self._log(f"[gpu-check] preparing the demo corpus in {rel(s.data)}")
                corpora.prepare("synthetic", s.data, vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with open(os.path.join(s.data, "prepare.json"), encoding="utf-8") as f:
            return json.load(f)

    def train_command(self, save_dir, precision, kernel, updates, extra=(), seed=1):
        s = self.sizes
        arch = ["--arch", "transformer"] if kernel == "vanilla" else [
            "--arch", "realformer_transformer", "--residual-attention-kernel", kernel]
        cmd = [fairseq_runs.fairseq_cli("fairseq-train"), s.data, "--user-dir", USER_DIR, *arch, *s.model_flags,
               "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
               "--warmup-updates", str(s.warmup_updates), "--dropout", "0.1",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", str(s.max_tokens), "--max-update", str(updates), "--seed", str(seed),
               "--log-format", "simple", "--log-interval", str(s.log_interval), "--no-epoch-checkpoints",
               "--save-dir", save_dir, *PRECISIONS[precision][0], *extra]
        if self.dry_run:
            cmd.append("--cpu")
        return cmd

    def generate_command(self, save_dir, precision):
        cmd = [fairseq_runs.fairseq_cli("fairseq-generate"), self.sizes.data, "--user-dir", USER_DIR,
               "--path", os.path.join(save_dir, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4",
               "--batch-size", "64", "--max-len-a", "1.5", "--max-len-b", "10", "--remove-bpe", "sentencepiece"]
        if not self.dry_run:
            return cmd + ["--fp16"]
        return cmd + ["--cpu"] + (["--bf16"] if precision == "bf16" else [])

    def train_one(self, precision, kernel, test_sentences, updates=None, group="train", deadline=None, seed=1):
        """One ``fairseq-train`` run and its decoding; with ``deadline`` (a ``time.time()``)
        a run still going then is stopped and reported failed (run again, it resumes)."""
        name = f"{precision}/{kernel}" + (f"/seed{seed}" if seed != 1 else "")
        updates = updates or self.sizes.train_updates
        if PRECISIONS[precision][1] and self.dry_run:
            return check(name, "skipped", f"--{precision} trains on CUDA only (dry run on CPU)",
                         precision=precision, kernel=kernel, seed=seed)
        run_dir = os.path.join(self.work, group, f"{precision}-{kernel}" + (f"-seed{seed}" if seed != 1 else ""))
        if self.force and os.path.exists(os.path.join(run_dir, "train.json")):
            _clear_run(run_dir)
        cmd = self.train_command(run_dir, precision, kernel, updates, seed=seed)
        timeout = None if deadline is None else deadline - time.time()
        if timeout is not None and timeout < 5:
            return check(name, "failed", "not run: the section's reserved time was spent", precision=precision,
                         kernel=kernel, seed=seed)
        try:
            record = fairseq_runs.train_resumable(cmd, run_dir, label=f"[{name}] ", log=self.log,
                                                  max_update=updates, env=self.env(), timeout=timeout)
        except fairseq_runs.RunError as exc:
            first = str(exc).splitlines()[0]
            if deadline is not None and time.time() >= deadline - 1:
                first = f"stopped at the section's reserved time ({first})"
            return check(name, "failed", first, precision=precision, kernel=kernel, seed=seed,
                         log=rel(os.path.join(run_dir, "train.log")))
        lines = fairseq_runs.read_log(os.path.join(run_dir, "train.log"))
        train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(lines)["train"]]
        valid = record["curve"][-1]["loss"] if record["curve"] else None
        valid_nll = record["curve"][-1].get("nll_loss") if record["curve"] else None
        details = dict(precision=precision, kernel=kernel, seed=seed, updates=record["updates"],
                       seconds=record["seconds"], train_losses=train, valid_loss=valid, valid_nll=valid_nll,
                       command=portable(cmd), log=rel(os.path.join(run_dir, "train.log")))
        problems = []
        if record["status"] != "finished":
            problems.append(f"diverged: {record['reason']}")
        if record["updates"] != updates:
            problems.append(f"{record['updates']} of {updates} updates")
        losses = [loss for _, loss in train] + ([valid] if valid is not None else [])
        if not losses or not all(math.isfinite(x) for x in losses):
            problems.append("a non-finite or missing loss")
        elif len(train) < 2 or not train[-1][1] < train[0][1]:
            problems.append(f"training loss not falling: {[round(x, 3) for _, x in train]}")
        details["generate"] = self.generate_one(run_dir, precision, test_sentences, name, deadline=deadline)
        if details["generate"]["status"] != "passed":
            problems.append(f"decoding: {details['generate']['reason']}")
        return check(name, "failed" if problems else "passed", "; ".join(problems) or None, **details)

    def generate_one(self, run_dir, precision, test_sentences, name, deadline=None):
        cached = os.path.join(run_dir, "generate.json")
        if not self.force and fairseq_runs.read_json(cached) is not None:
            return fairseq_runs.read_json(cached)
        cmd = self.generate_command(run_dir, precision)
        out_path = os.path.join(run_dir, "generate.txt")
        timeout = None if deadline is None else max(1.0, deadline - time.time())
        with open(out_path, "w", encoding="utf-8") as out:
            try:
                code = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                                      env=self.env(), timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                return dict(command=portable(cmd), status="failed", output=rel(out_path),
                            reason="stopped at the section's reserved time")
        lines = fairseq_runs.read_log(out_path)
        hyps = fairseq_runs.parse_generate_output(lines)
        bleu = [line.split(" | ")[-1] for line in lines if "Generate test with beam=" in line]
        result = dict(command=portable(cmd), output=rel(out_path), hypotheses=len(hyps),
                      sentences=test_sentences, bleu_line=bleu[-1] if bleu else None)
        if code != 0:
            tail = [line for line in lines[-5:] if line.strip()]
            result.update(status="failed", reason=f"exit code {code}: {tail[-1] if tail else ''}")
        elif len(hyps) != test_sentences:
            result.update(status="failed", reason=f"{len(hyps)} hypotheses for {test_sentences} sentences")
        else:
            result.update(status="passed", reason=None)
        self.log(f"[{name}] decoded: {result['status']} ({result['bleu_line'] or result['reason']})")
        if result["status"] == "passed":
            fairseq_runs.write_json(cached, result)
        return result

    def step_train(self):
        """Every precision x kernel (seed 1); for the precision judgement also vanilla and
        further seeds of fp32 / fp16 / bf16 (``--seeds``): each kernel's gap to fp32 against
        vanilla's over the seeds (``precision.seed_gap_checks``)."""
        from .precision import seed_gap_checks

        summary = self.ensure_data()
        sentences = summary["counts"]["test"]
        kernels = ["vanilla"] + [k for k in self.kernels if k != "vanilla"]
        gap_precisions = [p for p in self.precisions if p in ("fp32", "fp16", "bf16")]
        jobs = [(p, k, 1) for p in self.precisions for k in kernels
                if k != "vanilla" or p in gap_precisions]
        if "fp32" in gap_precisions and len(gap_precisions) > 1:
            jobs += [(p, k, seed) for seed in self.seeds if seed != 1 for p in gap_precisions for k in kernels]
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            checks = list(pool.map(lambda job: self.train_one(job[0], job[1], sentences, seed=job[2]), jobs))
        return checks + seed_gap_checks(checks, judged=not self.dry_run)
