"""Everything a GPU must prove, in steps that each fit a short GPU lease.

    python -m realformer_nmt.experiments.gpu_check [--steps tests,train,ddp,speed] [--out results/gpu]
    python -m realformer_nmt.experiments.gpu_check --quick [--out results/gpu]   # first (sized for 7 minutes)
    python -m realformer_nmt.experiments.gpu_check --dry-run      # CPU, toy sizes (CI)
    python -m realformer_nmt.experiments.gpu_check --quick --dry-run

Steps (each writes ``<out>/<step>.json``; ``<out>/summary.md`` is rewritten after each):

* ``tests``: ``pytest -m gpu``: every kernel in fp16/bf16/amp against a float32
  reference of the same weights, forward and backward; cached decoding against the full
  pass; 48-layer finiteness (``tests/test_gpu.py``).
* ``train``: ``fairseq-train`` on the demo corpus with every precision (fp32,
  ``--fp16``, ``--bf16``, ``--amp``, ``--memory-efficient-fp16``) and every kernel: loss
  finite and falling, the checkpoint decodes with ``fairseq-generate --fp16``; the fp16
  loss is compared with fp32 (target: within 1% after 300 updates).
* ``ddp``: two ranks on the one GPU (gloo: NCCL refuses two ranks on one device) with
  ``--fp16``, for ``--ddp-backend pytorch_ddp`` and ``legacy_ddp``.
* ``speed``: ``scripts/benchmark_speed.py`` in fp16 and bf16 (vanilla and every
  kernel; T = 128, 512, 1024; base and big), and ``scripts/benchmark_kernels.py``, which
  writes ``<out>/kernel_rule.json`` (the rule ``auto`` applies on CUDA) and copies it to the
  user's rule, ``~/.cache/realformer_nmt/kernel_rule.json`` (``$XDG_CACHE_HOME`` honoured).

``--quick`` (run it first): one command that answers the main questions, sized for under
7 minutes on one H100 (not yet timed on a GPU), and writes ``<out>/quick.json`` and
``<out>/summary.md`` (small enough to copy back from a remote machine):

* exactness, float32: a 6+6 model with every path on, sum and mean, each kernel (``bias``,
  ``fused``, ``auto``) against ``materialized``, per parameter tensor (relative error <=
  1e-4), the ``bias`` layer's mask gradient, and the SDPA backend ``torch.profiler`` saw
  run for the ``bias`` layer, forward and backward (``exactness.py``);
* mixed precision: 300 updates of the demo model in fp32, ``--fp16`` and ``--bf16`` for
  vanilla ``transformer``, ``materialized``, ``bias`` and ``auto``: loss finite and
  falling, fp16 / bf16 valid loss within 1% of fp32's, the checkpoint decodes with
  ``fairseq-generate --fp16``;
* speed and memory: base size, fp16, T = 128 and 512, each kernel's train tokens/s and
  peak memory as a ratio to vanilla in the same process, against the targets;
* two ranks on the one GPU, ``--fp16``, ``pytorch_ddp``, 50 updates.

The full check (the steps above) is the second call.

Resumable: a step whose JSON is in ``--out`` (from a run of the same kind, dry or
not) is not run again (``--force`` runs it again); inside ``train`` and ``speed`` every
finished run / benchmark is kept too, so a step cut off by a time limit goes on where
it stopped. ``--dry-run`` runs every step on the CPU at toy sizes through the same
code (what needs CUDA, fp16 and amp training, is reported as skipped), so CI proves the
command works. Paths in the JSON are relative to the working directory.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional

import realformer_nmt

from ..errors import ConfigError
from ..modules.residual_attention import KERNELS, user_kernel_rule_path
from . import distributed_runs, fairseq_runs

STEPS = ("tests", "train", "ddp", "speed")
STEP_SECONDS = 480  # a step must finish in 8 minutes: each fits one 10-minute device command
REPO = os.path.dirname(os.path.dirname(os.path.abspath(realformer_nmt.__file__)))
USER_DIR = os.path.dirname(os.path.abspath(realformer_nmt.__file__))
DEFAULT_OUT = os.path.join("results", "gpu")
DRY_RUN_OUT = os.path.join("runs", "gpu_check_dry_run")

# precision -> (fairseq-train flags, needs CUDA)
PRECISIONS = {
    "fp32": ([], False),
    "fp16": (["--fp16"], True),
    "bf16": (["--bf16"], False),
    "amp": (["--amp"], True),
    "memory-efficient-fp16": (["--memory-efficient-fp16"], True),
}
DDP_BACKENDS = ("pytorch_ddp", "legacy_ddp")
FP16_LOSS_TOLERANCE = 0.01  # the target: fp16 loss within 1% of fp32
DDP_MARGIN_SECONDS = 30  # of a step's cap, kept for loading the checkpoints and writing ddp.json

QUICK_SECONDS = 420  # --quick: the whole command within 7 minutes on one H100
QUICK_KERNELS = ("vanilla", "materialized", "bias", "auto")  # vanilla: fairseq's own transformer
QUICK_PRECISIONS = ("fp32", "fp16", "bf16")
QUICK_SECTIONS = ("exactness", "train", "speed", "ddp")
# the dry run trains these kernels only (CI time); every kernel's exactness is checked there
QUICK_DRY_KERNELS = ("vanilla", "bias")
# the speed targets (docs/gpu.md): bias (or auto) vs vanilla, fp16, base size
SPEED_TARGETS = {512: (0.90, 1.15), 128: (0.95, 1.05)}


@dataclasses.dataclass
class QuickSizes:
    exact: Dict[str, int]
    train_updates: int
    ddp_updates: int
    speed_args: List[str]


QUICK_REAL = QuickSizes(
    exact=dict(layers=6, embed=256, heads=4, vocab=200, batch=8, src_len=40, tgt_len=36),
    train_updates=300, ddp_updates=50,
    speed_args="--sizes base --lengths 128,512 --alternations 3 --warmup 1 --decode-alternations 1".split(),
)
QUICK_DRY = QuickSizes(
    exact=dict(layers=4, embed=16, heads=4, vocab=30, batch=3, src_len=8, tgt_len=6),
    train_updates=9, ddp_updates=6,
    speed_args=("--sizes toy --lengths 8,16 --alternations 1 --warmup 0 --tokens 256 --vocab 100 "
                "--decode-sentences 2 --decode-len 4 --no-memory").split(),
)


@dataclasses.dataclass
class Sizes:
    """How big each step runs: the real check, or the dry run's toy version."""

    data: str
    synthetic_sizes: Dict[str, int]
    vocab: int
    model_flags: List[str]
    max_tokens: int
    warmup_updates: int
    train_updates: int
    ddp_updates: int
    log_interval: int
    speed_args: List[str]
    kernel_args: List[str]
    speed_dtypes: List[str] = dataclasses.field(default_factory=lambda: ["float16", "bfloat16"])


REAL = Sizes(
    data=os.path.join("data-bin", "demo_en_de"), synthetic_sizes={}, vocab=1000,  # make demo's corpus
    model_flags=("--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 "
                 "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 "
                 "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings").split(),
    max_tokens=2048, warmup_updates=100, train_updates=300, ddp_updates=100, log_interval=25,
    speed_args="--sizes base,big --lengths 128,512,1024 --alternations 5 --decode-alternations 2".split(),
    kernel_args=("--lengths 128,512,1024 --layers 6 --batch 8 --embed-dim 512 --heads 8 --switch-points 2 "
                 "--rounds 5 --warmup 1").split(),
)
DRY = Sizes(
    data=None, synthetic_sizes=dict(n_train=1000, n_valid=50, n_test=50), vocab=200,
    model_flags=("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                 "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
                 "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings").split(),
    max_tokens=1024, warmup_updates=4, train_updates=12, ddp_updates=8, log_interval=3,
    speed_args=("--sizes toy --lengths 8,16 --alternations 1 --warmup 0 --tokens 256 --vocab 100 "
                "--decode-sentences 2 --decode-len 4 --no-memory").split(),
    kernel_args=("--lengths 8,16 --layers 3 --batch 2 --embed-dim 32 --heads 4 --switch-points 2 "
                 "--rounds 1 --warmup 0").split(),
)


def rel(path) -> str:
    """``path`` relative to the working directory (no machine paths in the JSON)."""
    return os.path.relpath(os.path.abspath(str(path)))


def portable(cmd) -> str:
    """A command as a shell line without machine paths: tools by name, files relative."""
    words = []
    for word in map(str, cmd):
        if word == sys.executable:
            word = "python"
        elif os.path.isabs(word) and os.path.dirname(word) == os.path.dirname(sys.executable):
            word = os.path.basename(word)  # fairseq-train ... next to the interpreter
        elif os.path.isabs(word):
            word = rel(word)
        words.append(word)
    return " ".join(shlex.quote(w) for w in words)


def check(name, status, reason=None, **details):
    return {"name": name, "status": status, "reason": reason, **details}


def step_status(checks) -> str:
    statuses = {c["status"] for c in checks}
    if "failed" in statuses:
        return "failed"
    if statuses <= {"skipped"}:
        return "skipped"
    return "passed"


class GpuCheck:
    def __init__(self, out=None, work=None, dry_run=False, jobs=None, force=False, log=None,
                 kernels=None, precisions=None):
        self.dry_run = dry_run
        self.out = rel(out or (DRY_RUN_OUT if dry_run else DEFAULT_OUT))
        if dry_run and os.path.abspath(self.out) == os.path.abspath(os.path.join(REPO, DEFAULT_OUT)):
            raise ConfigError(f"--dry-run writes CPU results: give it another --out than {DEFAULT_OUT} "
                              "(its kernel_rule.json is what auto reads on CUDA)")
        default_work = os.path.join(self.out, "gpu_check_work") if dry_run else os.path.join("runs", "gpu_check")
        self.work = rel(work or default_work)
        self.sizes = dataclasses.replace(DRY if dry_run else REAL)
        if self.sizes.data is None:
            self.sizes.data = os.path.join(self.work, "toy_en_de")
        self.force = force
        self.device = "cpu" if dry_run else "cuda"
        self.jobs = jobs or (4 if not dry_run else 2)
        self._log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self.kernels = list(kernels or KERNELS)
        self.precisions = list(precisions or PRECISIONS)
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)

    def log(self, message):
        with self._lock:
            self._log(f"[gpu-check] {message}")

    # ------------------------------------------------------------------------------
    # running steps
    # ------------------------------------------------------------------------------

    def step_path(self, step):
        return os.path.join(self.out, f"{step}.json")

    def done(self, step) -> Optional[dict]:
        record = fairseq_runs.read_json(self.step_path(step))
        if record is not None and record.get("dry_run") == self.dry_run:
            return record
        return None

    def run(self, steps) -> Dict[str, dict]:
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here: run gpu_check on a GPU machine, or add --dry-run "
                              "(CPU, toy sizes)")
        results = {}
        for step in steps:
            record = None if self.force else self.done(step)
            if record is not None:
                self.log(f"{step}: done earlier ({record['status']}), kept ({self.step_path(step)}; "
                         "--force runs it again)")
            else:
                self.log(f"{step}: running")
                start = time.time()
                checks = getattr(self, f"step_{step}")()
                record = {
                    "step": step, "status": step_status(checks), "dry_run": self.dry_run,
                    "device": self.device_description(), "seconds": round(time.time() - start, 1),
                    "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "command": "python -m realformer_nmt.experiments.gpu_check --steps " + step
                               + (" --dry-run" if self.dry_run else "") + f" --out {rel(self.out)}",
                    "checks": checks,
                }
                fairseq_runs.write_json(self.step_path(step), fairseq_runs.finite_or_none(record))
                self.log(f"{step}: {record['status']} in {record['seconds']:.0f}s -> {self.step_path(step)}")
            results[step] = record
            self.write_summary()
        return results

    def device_description(self) -> str:
        import torch

        if self.dry_run:
            return f"cpu (dry run), torch {torch.__version__}"
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"

    def env(self, threads=None):
        # checkpoint loading stays weights-only under any environment: the plugin's
        # safe_checkpoint_loading patch refuses a full unpickle itself; the data fixes on, so that
        # fairseq-generate decodes every test sentence (each run is checked for all of them)
        return realformer_nmt.fairseq_patches.with_data_fixes(
            fairseq_runs.cli_env(threads or max(1, (os.cpu_count() or 1) // self.jobs)))

    # ------------------------------------------------------------------------------
    # tests
    # ------------------------------------------------------------------------------

    def step_tests(self):
        """``pytest -m gpu``; the dry run runs ``tests/test_gpu.py`` whole (its CPU cases
        run, its CUDA ones are skipped)."""
        xml = os.path.join(self.work, "pytest.xml")
        log_path = os.path.join(self.work, "pytest.log")
        tests = rel(os.path.join(REPO, "tests"))
        select = [os.path.join(tests, "test_gpu.py")] if self.dry_run else ["-m", "gpu", tests]
        cmd = [sys.executable, "-m", "pytest", *select, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
               "-o", "junit_family=xunit2"]
        self.log(f"tests: {portable(cmd)}")
        if os.path.exists(xml):
            os.remove(xml)
        with open(log_path, "w", encoding="utf-8") as out:
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(threads=os.cpu_count()),
                                      timeout=STEP_SECONDS, cwd=os.getcwd())
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        counts, failed, skip_reasons = _junit_counts(xml)
        tail = fairseq_runs.read_log(log_path)[-1:]
        details = dict(command=portable(cmd), log=rel(log_path), counts=counts, failed_tests=failed,
                       skip_reasons=skip_reasons, pytest_summary=tail[0] if tail else None)
        if code is None:
            return [check("pytest", "failed", f"pytest ran past {STEP_SECONDS // 60} minutes (a step must fit "
                          "one 10-minute device command)", **details)]
        if code not in (0, 5) or counts["failed"] or counts["errors"]:
            return [check("pytest", "failed", f"pytest exit code {code}: {len(failed)} failed", **details)]
        if counts["passed"] == 0:
            return [check("pytest", "skipped", "no test ran (no CUDA device)", **details)]
        reason = None
        if self.dry_run:
            reason = f"dry run: the CPU cases ran; {counts['skipped']} CUDA cases skipped (no CUDA)"
        return [check("pytest", "passed", reason, **details)]

    # ------------------------------------------------------------------------------
    # train
    # ------------------------------------------------------------------------------

    def ensure_data(self):
        """The demo corpus (``make demo``'s, ``data-bin/demo_en_de``), prepared once."""
        from ..data import corpora

        s = self.sizes
        wanted = corpora.prepare_settings("synthetic", vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with self._lock:
            if corpora.prepared_settings(s.data) != wanted:
                self._log(f"[gpu-check] preparing the demo corpus in {rel(s.data)}")
                corpora.prepare("synthetic", s.data, vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with open(os.path.join(s.data, "prepare.json"), encoding="utf-8") as f:
            return json.load(f)

    def train_command(self, save_dir, precision, kernel, updates, extra=()):
        s = self.sizes
        arch = ["--arch", "transformer"] if kernel == "vanilla" else [
            "--arch", "realformer_transformer", "--residual-attention-kernel", kernel]
        cmd = [fairseq_runs.fairseq_cli("fairseq-train"), s.data, "--user-dir", USER_DIR, *arch, *s.model_flags,
               "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
               "--warmup-updates", str(s.warmup_updates), "--dropout", "0.1",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", str(s.max_tokens), "--max-update", str(updates), "--seed", "1",
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

    def train_one(self, precision, kernel, test_sentences, updates=None, group="train"):
        name = f"{precision}/{kernel}"
        updates = updates or self.sizes.train_updates
        if PRECISIONS[precision][1] and self.dry_run:
            return check(name, "skipped", f"--{precision} trains on CUDA only (dry run on CPU)",
                         precision=precision, kernel=kernel)
        run_dir = os.path.join(self.work, group, f"{precision}-{kernel}")
        if self.force and os.path.exists(os.path.join(run_dir, "train.json")):
            _clear_run(run_dir)
        cmd = self.train_command(run_dir, precision, kernel, updates)
        try:
            record = fairseq_runs.train_resumable(cmd, run_dir, label=f"[{name}] ", log=self.log,
                                                  max_update=updates, env=self.env())
        except fairseq_runs.RunError as exc:
            return check(name, "failed", str(exc).splitlines()[0], precision=precision, kernel=kernel,
                         log=rel(os.path.join(run_dir, "train.log")))
        lines = fairseq_runs.read_log(os.path.join(run_dir, "train.log"))
        train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(lines)["train"]]
        valid = record["curve"][-1]["loss"] if record["curve"] else None
        details = dict(precision=precision, kernel=kernel, updates=record["updates"], seconds=record["seconds"],
                       train_losses=train, valid_loss=valid, command=portable(cmd),
                       log=rel(os.path.join(run_dir, "train.log")))
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
        details["generate"] = self.generate_one(run_dir, precision, test_sentences, name)
        if details["generate"]["status"] != "passed":
            problems.append(f"decoding: {details['generate']['reason']}")
        return check(name, "failed" if problems else "passed", "; ".join(problems) or None, **details)

    def generate_one(self, run_dir, precision, test_sentences, name):
        cached = os.path.join(run_dir, "generate.json")
        if not self.force and fairseq_runs.read_json(cached) is not None:
            return fairseq_runs.read_json(cached)
        cmd = self.generate_command(run_dir, precision)
        out_path = os.path.join(run_dir, "generate.txt")
        with open(out_path, "w", encoding="utf-8") as out:
            code = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                                  env=self.env()).returncode
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
        summary = self.ensure_data()
        sentences = summary["counts"]["test"]
        jobs = [(p, k) for p in self.precisions for k in self.kernels]
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            checks = list(pool.map(lambda job: self.train_one(*job, sentences), jobs))
        return checks

    # ------------------------------------------------------------------------------
    # ddp
    # ------------------------------------------------------------------------------

    def step_ddp(self):
        return self.ddp_checks(DDP_BACKENDS, self.sizes.ddp_updates, STEP_SECONDS, "ddp")

    def ddp_checks(self, backends, updates, cap_seconds, group):
        """Two ranks per backend, one backend after the other, all within ``cap_seconds``:
        each run gets an equal share of what is left (less a margin to load its checkpoint
        and write the JSON); a run that overstays is killed and reported as a failed check."""
        from fairseq import checkpoint_utils

        self.ensure_data()
        deadline = time.time() + cap_seconds - DDP_MARGIN_SECONDS
        precision = "fp32" if self.dry_run else "fp16"
        checks = []
        for i, backend in enumerate(backends):
            name = f"{backend} x2 ({precision}, gloo)"
            share = (deadline - time.time()) / (len(backends) - i)
            if share < 1:
                checks.append(check(name, "failed", f"no time left in the step's {cap_seconds}-second cap",
                                    backend=backend, precision=precision))
                continue
            run_dir = os.path.join(self.work, group, backend)
            _clear_run(run_dir)
            cmd = self.train_command(run_dir, precision, "auto", updates, extra=["--ddp-backend", backend])
            self.log(f"ddp: {name}: two ranks of {portable(cmd)} + {' '.join(distributed_runs.rank_flags(0, 2))}"
                     f" (at most {share:.0f}s)")
            result = distributed_runs.train_ranks(cmd, 2, run_dir, env=self.env(), timeout=share)
            lines = fairseq_runs.read_log(result["logs"][0])
            train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(lines)["train"]]
            details = dict(backend=backend, precision=precision, returncodes=result["returncodes"],
                           devices=result["devices"], seconds=result["seconds"], train_losses=train,
                           time_limit=round(share, 1),
                           command=portable(cmd) + " " + " ".join(distributed_runs.rank_flags("R", 2)),
                           logs=[rel(p) for p in result["logs"]])
            problems = []
            if result["seconds"] >= share and any(code != 0 for code in result["returncodes"]):
                problems.append(f"killed after {share:.0f}s (its share of the step's {cap_seconds}-second cap): "
                                f"a rank hung or trained too slowly; exit codes {result['returncodes']}")
            elif result["returncodes"] != [0, 0]:
                tails = [fairseq_runs.read_log(p)[-1:] for p in result["logs"]]
                problems.append(f"exit codes {result['returncodes']}: {tails}")
            elif result["devices"] != 2:
                problems.append(f"rank 0 trained on {result['devices']} devices, not 2")
            if not problems:
                losses = [loss for _, loss in train]
                if len(losses) < 2 or not all(math.isfinite(x) for x in losses) or not losses[-1] < losses[0]:
                    problems.append(f"training loss not finite and falling: {losses}")
                try:
                    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(run_dir, "checkpoint_last.pt"))
                    done = state["optimizer_history"][-1]["num_updates"]
                    details["checkpoint_updates"] = done
                    if done != updates:
                        problems.append(f"checkpoint after {done} updates, not {updates}")
                except Exception as exc:  # any load failure is what this check reports
                    problems.append(f"checkpoint does not load: {exc}")
            self.log(f"ddp: {name}: {'failed: ' + '; '.join(problems) if problems else 'passed'}")
            checks.append(check(name, "failed" if problems else "passed", "; ".join(problems) or None, **details))
        if self.dry_run:
            checks.append(check("--fp16 ranks", "skipped", "--fp16 trains on CUDA only (dry run on CPU)"))
        return checks

    # ------------------------------------------------------------------------------
    # speed
    # ------------------------------------------------------------------------------

    def speed_path(self, dtype):
        return os.path.join(self.out, f"speed_{dtype}.json")

    def rule_path(self):
        return os.path.join(self.out, "kernel_rule.json")

    def step_speed(self):
        """The kernel benchmark first: with ``--out results/gpu`` its ``kernel_rule.json`` is
        the rule ``auto`` applies on CUDA, so the speed benchmark's ``auto`` runs it."""
        device = ["--device", self.device]
        cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_kernels.py")), *device,
               "--dtype", "float16", *self.sizes.kernel_args,
               "--json", os.path.join(self.work, "kernel_timing_float16.json"), "--rule", self.rule_path()]
        benchmarks = [("benchmark_kernels float16 -> kernel rule", cmd, self.rule_path())]
        for dtype in self.sizes.speed_dtypes:
            cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_speed.py")), *device,
                   "--dtype", dtype, *self.sizes.speed_args, "--variants", ",".join(["vanilla"] + self.kernels),
                   "--json", self.speed_path(dtype)]
            benchmarks.append((f"benchmark_speed {dtype}", cmd, self.speed_path(dtype)))
        checks = []
        for name, cmd, result_path in benchmarks:
            if not self.force and os.path.exists(result_path):
                self.log(f"speed: {name}: done earlier, kept ({result_path})")
                checks.append(check(name, "passed", None, command=portable(cmd), result=rel(result_path)))
                continue
            log_path = os.path.join(self.work, os.path.basename(result_path).replace(".json", ".log"))
            self.log(f"speed: {name}: {portable(cmd)}")
            # dry run: toy models, where one thread is fastest on a shared CPU
            threads = 1 if self.dry_run else os.cpu_count()
            code, lines = self.run_echoed(cmd, log_path, f"[{name}] ", self.env(threads=threads))
            if code != 0:
                tail = [line for line in lines[-5:] if line.strip()]
                checks.append(check(name, "failed", f"exit code {code}: {tail[-1] if tail else ''}",
                                    command=portable(cmd), log=rel(log_path)))
            else:
                checks.append(check(name, "passed", None, command=portable(cmd), result=rel(result_path),
                                    log=rel(log_path)))
        if not self.dry_run and os.path.isfile(self.rule_path()):
            # the user's own rule: what `auto` reads on this machine, installed wheel or checkout
            user_rule = user_kernel_rule_path()
            os.makedirs(os.path.dirname(user_rule), exist_ok=True)
            shutil.copyfile(self.rule_path(), user_rule)
            self.log(f"speed: kernel rule copied to {user_rule} ('auto' reads it on CUDA)")
        if not self.dry_run or not checks:
            return checks
        checks.append(check("peak CUDA memory", "skipped", "torch.cuda.max_memory_allocated needs CUDA (dry run)"))
        return checks

    def run_echoed(self, cmd, log_path, label, env):
        """Run ``cmd``, its output to ``log_path`` and, line by line, to the log (progress)."""
        lines = []
        with open(log_path, "w", encoding="utf-8", buffering=1) as out:
            proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, encoding="utf-8", errors="replace", env=env)
            for line in proc.stdout:
                out.write(line)
                lines.append(line.rstrip("\n"))
                if " | INFO | " not in line:  # fairseq's import-time chatter
                    self.log(label + lines[-1])
            proc.wait()
        return proc.returncode, lines

    # ------------------------------------------------------------------------------
    # --quick: the main answers in one short command
    # ------------------------------------------------------------------------------

    def quick_path(self):
        return os.path.join(self.out, "quick.json")

    def run_quick(self) -> dict:
        """Every section of ``--quick`` in order, ``quick.json`` and ``summary.md`` rewritten
        after each (a command cut off still leaves what it answered). A section that would
        start after the 7-minute budget is reported as failed, not run."""
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here: run gpu_check --quick on a GPU machine, or add --dry-run "
                              "(CPU, toy sizes)")
        q = QUICK_DRY if self.dry_run else QUICK_REAL
        start = time.time()
        record = {
            "quick": True, "dry_run": self.dry_run, "device": self.device_description(), "status": None,
            "seconds": None, "budget_seconds": QUICK_SECONDS,
            "command": "make gpu-check GPU_CHECK_ARGS=\"--quick" + (" --dry-run" if self.dry_run else "")
                       + f" --out {rel(self.out)}\"",
            "sections": {},
        }
        for section in QUICK_SECTIONS:
            spent = time.time() - start
            if spent > QUICK_SECONDS and not self.dry_run:
                checks = [check(section, "failed", f"not run: the quick check had spent {spent:.0f}s of its "
                                                   f"{QUICK_SECONDS}s budget")]
            else:
                self.log(f"quick: {section}")
                t0 = time.time()
                checks = getattr(self, f"quick_{section}")(q, max(60.0, QUICK_SECONDS - spent))
                self.log(f"quick: {section}: {step_status(checks)} in {time.time() - t0:.0f}s")
            record["sections"][section] = {"status": step_status(checks),
                                           "seconds": round(time.time() - start - spent, 1), "checks": checks}
            record["seconds"] = round(time.time() - start, 1)
            record["status"] = step_status([c for sec in record["sections"].values() for c in sec["checks"]])
            record["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            fairseq_runs.write_json(self.quick_path(), fairseq_runs.finite_or_none(record))
            self.write_summary()
        return record

    def quick_exactness(self, q, budget):
        from . import exactness

        checks = exactness.run(self.device, q.exact, log=self.log)
        if not self.dry_run:
            import torch

            torch.cuda.empty_cache()
        return checks

    def quick_train(self, q, budget):
        summary = self.ensure_data()
        sentences = summary["counts"]["test"]
        jobs = [(p, k) for p in QUICK_PRECISIONS for k in QUICK_KERNELS]

        def train(job):
            precision, kernel = job
            if self.dry_run and kernel not in QUICK_DRY_KERNELS:
                return check(f"{precision}/{kernel}", "skipped", "dry run: CI trains "
                             f"{' and '.join(QUICK_DRY_KERNELS)} only (the same command with another kernel)",
                             precision=precision, kernel=kernel)
            return self.train_one(precision, kernel, sentences, updates=q.train_updates, group="quick_train")

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            checks = list(pool.map(train, jobs))
        return checks + self.precision_agreement(checks)

    def precision_agreement(self, checks):
        """fp16 and bf16 valid loss within 1% of fp32's, per kernel (on CUDA a failed check;
        the dry run's few updates on CPU are reported, not judged)."""
        runs = {(c.get("precision"), c.get("kernel")): c for c in checks}
        out = []
        for precision in ("fp16", "bf16"):
            for kernel in QUICK_KERNELS:
                run, ref = runs.get((precision, kernel), {}), runs.get(("fp32", kernel), {})
                name = f"{precision} valid loss within 1% of fp32 ({kernel})"
                loss, base = run.get("valid_loss"), ref.get("valid_loss")
                if run.get("status") == "skipped" or ref.get("status") == "skipped":
                    out.append(check(name, "skipped", run.get("reason") or ref.get("reason"), precision=precision,
                                     kernel=kernel))
                    continue
                if loss is None or not base:
                    out.append(check(name, "failed", "a valid loss is missing", precision=precision, kernel=kernel))
                    continue
                diff = abs(loss - base) / base
                status, reason = ("passed", None) if diff <= FP16_LOSS_TOLERANCE else (
                    "failed", f"{100 * diff:.2f}% from fp32")
                if self.dry_run:
                    status, reason = "passed", (f"dry run: {100 * diff:.2f}% after {QUICK_DRY.train_updates} toy "
                                                "updates on CPU, reported, not judged")
                out.append(check(name, status, reason, precision=precision, kernel=kernel, valid_loss=loss,
                                 fp32_valid_loss=base, relative=diff))
        return out

    def quick_speed(self, q, budget):
        result_path = os.path.join(self.work, "quick_speed_float16.json")
        log_path = os.path.join(self.work, "quick_speed_float16.log")
        kernels = [k for k in KERNELS]
        cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_speed.py")), "--device", self.device,
               "--dtype", "float16", *q.speed_args, "--variants", ",".join(["vanilla"] + kernels),
               "--json", result_path]
        if self.force and os.path.exists(result_path):
            os.remove(result_path)
        if not os.path.exists(result_path):
            self.log(f"speed: {portable(cmd)}")
            code, lines = self.run_echoed(cmd, log_path, "[speed] ", self.env(threads=1 if self.dry_run else None))
            if code != 0:
                tail = [line for line in lines[-5:] if line.strip()]
                return [check("benchmark_speed float16", "failed", f"exit code {code}: {tail[-1] if tail else ''}",
                              command=portable(cmd), log=rel(log_path))]
        result = fairseq_runs.read_json(result_path) or {}
        table = []
        for config in result.get("configs", []):
            for variant, r in config["variants"].items():
                table.append(dict(size=config["size"], length=config["length"], variant=variant,
                                  train_tokens_per_second=r.get("train_tokens_per_second"),
                                  train_speed_ratio=r.get("train_speed_ratio"),
                                  peak_memory_mib=r.get("peak_memory_mib"),
                                  peak_memory_ratio=r.get("peak_memory_ratio")))
        checks = [check("benchmark_speed float16", "passed", None, command=portable(cmd), table=table,
                        gpu=result.get("gpu") or result.get("device"), torch=result.get("torch"))]
        for row in speed_targets(result):
            name = (f"{row['variant']} at T = {row['length']}: train >= {row['min_speed']:.2f}x vanilla, "
                    f"peak memory <= {row['max_memory']:.2f}x")
            if self.dry_run:
                checks.append(check(name, "skipped", "dry run: CPU toy sizes, not the target's conditions", **row))
            elif row["met"] is None:
                checks.append(check(name, "failed", "not measured", **row))
            else:
                checks.append(check(name, "passed" if row["met"] else "failed",
                                    None if row["met"] else "target not met", **row))
        if self.dry_run:
            checks.append(check("speed targets", "skipped", "dry run: CPU toy lengths (the targets are fp16 on "
                                                              "CUDA at T = 128 and 512)"))
        return checks

    def quick_ddp(self, q, budget):
        return self.ddp_checks(("pytorch_ddp",), q.ddp_updates, int(min(budget, STEP_SECONDS)), "quick_ddp")

    # ------------------------------------------------------------------------------
    # summary
    # ------------------------------------------------------------------------------

    def write_summary(self):
        records = {s: fairseq_runs.read_json(self.step_path(s)) for s in STEPS}
        quick = fairseq_runs.read_json(self.quick_path())
        text = quick_markdown(quick) if quick is not None and quick.get("dry_run") == self.dry_run else ""
        if text and not any(records.values()):
            return self._write_summary_text(text)
        text = text + ("\n" if text else "") + summary_markdown(records, self)
        self._write_summary_text(text)

    def _write_summary_text(self, text):
        with open(os.path.join(self.out, "summary.md"), "w", encoding="utf-8") as f:
            f.write(text)


def _clear_run(run_dir):
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            path = os.path.join(run_dir, name)
            if os.path.isfile(path):
                os.remove(path)


def _junit_counts(xml_path):
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed, reasons = [], {}
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (OSError, ElementTree.ParseError):
        return counts, failed, reasons
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            failed.append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            failed.append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            reason = case.find("skipped").get("message", "")
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts, failed, reasons


# ----------------------------------------------------------------------------------
# summary.md
# ----------------------------------------------------------------------------------


def _verdict(met, status=None):
    if met is None:
        return f"not measured ({status})" if status else "not measured"
    return "met" if met else "not met"


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def speed_targets(speed: Optional[dict]):
    """The issue's speed targets on the fp16 benchmark: ``bias`` (or ``auto``) train tok/s
    >= 0.90x vanilla and peak memory <= 1.15x at T = 512; >= 0.95x and <= 1.05x at T = 128."""
    bounds = SPEED_TARGETS
    rows = []
    for config in (speed or {}).get("configs", []):
        if config["length"] not in bounds:
            continue
        min_speed, max_mem = bounds[config["length"]]
        best = None
        for variant in ("bias", "auto"):
            r = config["variants"].get(variant)
            if r is None:
                continue
            speed_ratio, mem_ratio = r.get("train_speed_ratio"), r.get("peak_memory_ratio")
            met = None
            if speed_ratio is not None and mem_ratio is not None:
                met = speed_ratio >= min_speed and mem_ratio <= max_mem
            row = dict(size=config["size"], length=config["length"], variant=variant, speed_ratio=speed_ratio,
                       memory_ratio=mem_ratio, min_speed=min_speed, max_memory=max_mem, met=met)
            if best is None or (met and not best["met"]):  # bias unless only auto meets it
                best = row
        if best:
            rows.append(best)
    return rows


def loss_targets(train: Optional[dict]):
    """fp16 loss after the run within 1% of fp32's, per kernel (final validation loss)."""
    runs = {(c.get("precision"), c.get("kernel")): c for c in (train or {}).get("checks", [])}
    rows = []
    for (precision, kernel), c in runs.items():
        if precision != "fp16":
            continue
        ref = runs.get(("fp32", kernel), {}).get("valid_loss")
        loss = c.get("valid_loss")
        diff = abs(loss - ref) / ref if loss is not None and ref else None
        met = None if diff is None else diff <= FP16_LOSS_TOLERANCE
        rows.append(dict(kernel=kernel, fp16=loss, fp32=ref, relative=diff, met=met, status=c["status"]))
    return rows


def _cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def quick_markdown(record) -> str:
    """``summary.md``'s part for ``quick.json``: every answer of ``--quick`` in a few tables."""
    dry = record.get("dry_run")
    lines = ["# GPU quick check" + (" (dry run: CPU, toy sizes; not a measurement)" if dry else ""), "",
             f"`{record.get('command')}` on {record.get('device')}: **{record.get('status')}** in "
             f"{record.get('seconds')}s (budget {record.get('budget_seconds')}s). Details: `quick.json` "
             "next to this file; docs/gpu.md says how to read it.", "",
             "| section | status | seconds | failed checks |", "| --- | --- | --- | --- |"]
    sections = record.get("sections", {})
    for name in QUICK_SECTIONS:
        sec = sections.get(name)
        if sec is None:
            lines.append(f"| {name} | not run | - | |")
            continue
        failed = "; ".join(f"{c['name']}: {c['reason']}" for c in sec["checks"] if c["status"] == "failed")
        lines.append(f"| {name} | {sec['status']} | {sec['seconds']:.0f} | {_cell(failed[:500])} |")
    exact = sections.get("exactness")
    if exact:
        lines += ["", "## exactness (float32, per parameter tensor, relative error <= 1e-4)", "",
                  "| check | status | max relative error | worst tensor | tensors (q/k projections) |",
                  "| --- | --- | --- | --- | --- |"]
        for c in exact["checks"]:
            if "max_relative" in c:
                lines.append(f"| {c['name']} | {c['status']} | {_fmt(c['max_relative'], 8)} | "
                             f"`{c['worst_tensor']}` | {c['tensors']} ({c['q_k_projections']}) |")
            elif "relative_errors" in c:
                errs = ", ".join(f"{k} {v:.1e}" for k, v in c["relative_errors"].items())
                lines.append(f"| {c['name']} | {c['status']} | {errs} | | |")
            elif "forward" in c:
                lines.append(f"| {c['name']} | {c['status']} | forward {', '.join(c['forward']['backends'])}; "
                             f"backward {', '.join(c['backward']['backends'])} | | |")
    train = sections.get("train")
    if train:
        lines += ["", "## mixed precision (fairseq-train on the demo corpus, then fairseq-generate)", "",
                  "| precision | kernel | status | updates | first / last train loss | valid loss | decode |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in train["checks"]:
            if "fp32_valid_loss" in c or c["name"].startswith(("fp16 valid", "bf16 valid")):
                continue
            losses = c.get("train_losses") or []
            first_last = f"{_fmt(losses[0][1], 3)} / {_fmt(losses[-1][1], 3)}" if losses else "-"
            decode = (c.get("generate") or {}).get("bleu_line") or (c.get("generate") or {}).get("reason") or "-"
            status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
            lines.append(f"| {c.get('precision')} | {c.get('kernel')} | {_cell(status)} | {c.get('updates', '-')} | "
                         f"{first_last} | {_fmt(c.get('valid_loss'), 3)} | {_cell(decode)} |")
        rows = [c for c in train["checks"] if c["name"].startswith(("fp16 valid", "bf16 valid"))]
        if rows:
            lines += ["", "| target | status | valid loss | fp32 valid loss | difference |",
                      "| --- | --- | --- | --- | --- |"]
            for c in rows:
                diff = "-" if c.get("relative") is None else f"{100 * c['relative']:.2f}%"
                status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
                lines.append(f"| {c['name']} | {_cell(status)} | {_fmt(c.get('valid_loss'), 3)} | "
                             f"{_fmt(c.get('fp32_valid_loss'), 3)} | {diff} |")
    speed = sections.get("speed")
    if speed:
        lines += ["", "## speed and memory (fp16, ratios to vanilla in the same process)", ""]
        table = next((c.get("table") for c in speed["checks"] if c.get("table")), None)
        if table:
            lines += ["| size | T | variant | train tok/s | x vanilla | peak MiB | x vanilla |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for r in table:
                lines.append(f"| {r['size']} | {r['length']} | {r['variant']} | "
                             f"{_fmt(r['train_tokens_per_second'], 0)} | {_fmt(r['train_speed_ratio'])} | "
                             f"{_fmt(r['peak_memory_mib'], 0)} | {_fmt(r['peak_memory_ratio'])} |")
        for c in speed["checks"]:
            if c.get("table") is None:
                lines.append(f"- {c['name']}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else ""))
    ddp = sections.get("ddp")
    if ddp:
        lines += ["", "## two ranks on one GPU", ""]
        for c in ddp["checks"]:
            losses = ", ".join(f"{x:.2f}" for _, x in c.get("train_losses", []))
            lines.append(f"- {c['name']}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else "")
                         + (f"; train losses {losses}" if losses else ""))
    return "\n".join(lines) + "\n"


def summary_markdown(records, ctx) -> str:
    dry = ctx.dry_run
    lines = ["# GPU check" + (" (dry run: CPU, toy sizes; not a measurement)" if dry else ""), ""]
    lines.append("Made by `python -m realformer_nmt.experiments.gpu_check` (`make gpu-check`); "
                 "see docs/gpu.md. Each step's JSON is next to this file.")
    lines += ["", "| step | status | seconds | device | note |", "| --- | --- | --- | --- | --- |"]
    for step in STEPS:
        r = records.get(step)
        if r is None:
            lines.append(f"| {step} | not run | - | - | |")
            continue
        counts = {}
        for c in r["checks"]:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        notes = [", ".join(f"{n} {status}" for status, n in counts.items())] if len(r["checks"]) > 1 else []
        notes += [f"{c['name']}: {c['reason']}" for c in r["checks"] if c["status"] == "failed"]
        skipped = sorted({c["reason"] for c in r["checks"] if c["status"] == "skipped"})
        notes += [f"skipped: {'; '.join(skipped)}"] if skipped else []
        notes += [c["reason"] for c in r["checks"] if c["status"] == "passed" and c.get("reason")]
        note = "; ".join(notes)
        if len(note) > 600:
            note = note[:600] + " ..."
        lines.append(f"| {step} | {r['status']} | {r['seconds']:.0f} | {r['device']} | {note.replace('|', '/')} |")

    tests = records.get("tests")
    if tests:
        c = tests["checks"][0]
        lines += ["", "## tests", "", f"`{c.get('command')}`: {c.get('counts')}"]
        if c.get("failed_tests"):
            lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in c["failed_tests"])]

    train = records.get("train")
    if train:
        lines += ["", "## train (fairseq-train on the demo corpus, then fairseq-generate)", "",
                  "| precision | kernel | status | updates | first / last train loss | valid loss | x fp32 | decode |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        ref = {c.get("kernel"): c.get("valid_loss") for c in train["checks"] if c.get("precision") == "fp32"}
        for c in train["checks"]:
            if c["status"] == "skipped":
                lines.append(f"| {c['precision']} | {c['kernel']} | skipped: {c['reason']} | | | | | |")
                continue
            losses = c.get("train_losses") or []
            first_last = f"{_fmt(losses[0][1], 3)} / {_fmt(losses[-1][1], 3)}" if losses else "-"
            base = ref.get(c.get("kernel"))
            ratio = c["valid_loss"] / base if c.get("valid_loss") is not None and base else None
            gen = c.get("generate") or {}
            decode = gen.get("bleu_line") or gen.get("reason") or "-"
            status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
            lines.append(f"| {c['precision']} | {c['kernel']} | {status.replace('|', '/')} | {c.get('updates', '-')} | "
                         f"{first_last} | {_fmt(c.get('valid_loss'), 3)} | {_fmt(ratio, 4)} | "
                         f"{decode.replace('|', '/')} |")

    ddp = records.get("ddp")
    if ddp:
        lines += ["", "## ddp (two ranks, gloo)", "", "| run | status | seconds | train losses |",
                  "| --- | --- | --- | --- |"]
        for c in ddp["checks"]:
            losses = ", ".join(f"{x:.2f}" for _, x in c.get("train_losses", []))
            status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
            lines.append(f"| {c['name']} | {status.replace('|', '/')} | {c.get('seconds', '-')} | {losses} |")

    from . import benchmark

    speed_results = {}
    for dtype in ctx.sizes.speed_dtypes:
        result = fairseq_runs.read_json(ctx.speed_path(dtype))
        if result:
            speed_results[dtype] = result
            lines += ["", f"## speed, {dtype} (`{result.get('command', '')}`)", "",
                      f"{result.get('gpu') or result.get('device')}, torch {result.get('torch')}. "
                      "Ratios are to vanilla `transformer` in the same run.", "",
                      benchmark.markdown_table(result).rstrip()]
    rule = fairseq_runs.read_json(ctx.rule_path())
    if rule:
        lines += ["", "## kernel rule for `auto` on CUDA (`kernel_rule.json`)", "",
                  f"On {rule['device']} ({rule['dtype']}): first layer of a path **{rule['rule']['first_layer']}**, "
                  f"later layers **{rule['rule']['later_layers']}** (fastest per position with peak memory not "
                  f"above materialized). Command: `{rule['command']}`", "",
                  "| variant (first+later) | time x materialized (geomean) | memory not above materialized |",
                  "| --- | --- | --- |"]
        m = rule["measured"]
        for name, score in sorted(m["geomean_ratio_to_materialized"].items(), key=lambda kv: kv[1]):
            lines.append(f"| {name} | {score:.2f} | {m['memory_not_worse_than_materialized'][name]} |")

    lines += ["", "## targets (issue 15)", ""]
    measured = "" if not dry else " (dry run: CPU toy sizes, not the target's conditions)"
    rows = speed_targets(speed_results.get("float16"))
    if rows:
        lines += ["| target | size | T | variant | train x vanilla | peak memory x vanilla | |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| train >= {r['min_speed']:.2f}x, memory <= {r['max_memory']:.2f}x (fp16) | {r['size']} | "
                         f"{r['length']} | {r['variant']} | {_fmt(r['speed_ratio'])} | {_fmt(r['memory_ratio'])} | "
                         f"{_verdict(r['met'])}{measured} |")
    else:
        lines.append("- speed at T = 128 and 512 in fp16: not measured" + (" (dry run lengths)" if dry else ""))
    rows = loss_targets(train)
    if rows:
        lines += ["", "| target | kernel | fp16 valid loss | fp32 valid loss | difference | |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            diff = "-" if r["relative"] is None else f"{100 * r['relative']:.2f}%"
            lines.append(f"| fp16 loss within 1% of fp32 after {ctx.sizes.train_updates} updates | {r['kernel']} | "
                         f"{_fmt(r['fp16'], 3)} | {_fmt(r['fp32'], 3)} | {diff} | "
                         f"{_verdict(r['met'], r['status'])}{measured} |")
    else:
        lines.append("- fp16 loss within 1% of fp32: not measured" + (" (fp16 needs CUDA)" if dry else ""))
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m realformer_nmt.experiments.gpu_check",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma list of {', '.join(STEPS)} (default: all, in that order)")
    p.add_argument("--out", default=None,
                   help=f"step JSON, summary.md, kernel_rule.json and the speed JSON go here "
                        f"(default: {DEFAULT_OUT}; with --dry-run {DRY_RUN_OUT})")
    p.add_argument("--work", default=None,
                   help="checkpoints and logs (default: runs/gpu_check; with --dry-run <out>/gpu_check_work)")
    p.add_argument("--quick", action="store_true",
                   help="the main answers in one short command (sized for 7 minutes on one H100): exactness per "
                        "parameter tensor, fp16/bf16 training, speed and memory at T = 128 and 512, two DDP ranks; "
                        "writes <out>/quick.json and <out>/summary.md (run it first, then the full check)")
    p.add_argument("--dry-run", action="store_true",
                   help="every step on the CPU at toy sizes (CUDA-only parts reported as skipped)")
    p.add_argument("--force", "--redo", action="store_true", dest="force",
                   help="run the chosen steps again even where their results exist")
    p.add_argument("--kernels", default=None,
                   help=f"comma list of kernels the train and speed steps run (default: {', '.join(KERNELS)})")
    p.add_argument("--precisions", default=None,
                   help=f"comma list of precisions the train step runs (default: {', '.join(PRECISIONS)})")
    p.add_argument("--jobs", type=int, default=None,
                   help="fairseq-train runs at a time in the train step (default: 4 on CUDA, 2 dry)")
    args = p.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        p.error(f"--steps: unknown {', '.join(unknown) or '(empty)'} (choose from {', '.join(STEPS)})")
    if args.jobs is not None and args.jobs < 1:
        p.error("--jobs must be at least 1")
    args.steps = steps
    for flag, choices in (("kernels", KERNELS), ("precisions", tuple(PRECISIONS))):
        value = getattr(args, flag)
        if value is not None:
            words = [w.strip() for w in value.split(",") if w.strip()]
            bad = [w for w in words if w not in choices]
            if bad or not words:
                p.error(f"--{flag}: unknown {', '.join(bad) or '(empty)'} (choose from {', '.join(choices)})")
            setattr(args, flag, words)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        ctx = GpuCheck(args.out, args.work, args.dry_run, args.jobs, args.force,
                       kernels=args.kernels, precisions=args.precisions)
        if args.quick:
            record = ctx.run_quick()
        else:
            results = ctx.run(args.steps)
    except ConfigError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        print(f"summary: {os.path.join(ctx.out, 'summary.md')}")
        print(f"quick: {record['status']} ({ctx.quick_path()})")
        return 1 if record["status"] == "failed" else 0
    print(f"summary: {os.path.join(ctx.out, 'summary.md')}")
    for step, record in results.items():
        print(f"{step}: {record['status']}")
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
