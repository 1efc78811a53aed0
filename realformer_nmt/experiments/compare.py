"""Post-LN / Pre-LN / RealFormer on a translation corpus, one shared recipe and budget.

``compare``        trains every backbone for every seed with the same fairseq-train flags
                   (only the backbone flags differ), decodes each best checkpoint on ``test``
                   with beam search, scores it with sacreBLEU against the raw references,
                   tests every backbone against Post-LN on the same sentences (sacreBLEU's
                   paired bootstrap resampling, per seed) and writes ``<name>.json``,
                   ``<name>.md`` and ``<name>.png``.
``lr_sweep``       the paper's stability test (He et al. 2021, Fig. 3): the same recipe at a
                   normal and at higher peak learning rates (nothing else changes) for a short
                   budget; each run is marked ``ok``, ``diverged`` (NaN/inf, fairseq stopped)
                   or ``stalled`` (finished, but its best valid loss is more than ``margin``
                   above the same backbone's run at the normal learning rate).
``depth_stress``   narrow deep models (``L+L`` layers for each depth) where Post-LN is known
                   to struggle, every backbone incl. RealFormer's mean mode; each run is
                   ``ok`` / ``stalled`` / ``diverged`` by the sweep's rule, the reference being
                   the best run of the same seed.
``path_ablation``  which residual path matters: RealFormer with residual attention on the
                   encoder, decoder or cross path alone, on all three, and Post-LN.

Runs live in ``out/<backbone>/seed<k>/`` (``out/lr<lr>/...`` in the sweep, ``out/L<depth>/...``
in the depth test) with their checkpoints, ``train.log``, ``generate.txt`` and
``result.json``; a re-run with the same arguments reuses finished runs and resumes an
interrupted one (see ``fairseq_runs.train_resumable``). ``jobs`` runs that many trainings at
once (threads split between them), which changes no result.
"""

import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field, replace

from ..errors import ConfigError, DataError
from . import fairseq_runs

BACKBONES = ("postln", "preln", "realformer")  # the main comparison's default set
MAIN_ORDER = BACKBONES + ("realformer_preln", "realformer_mean")  # table and plot order of a comparison
DEPTH_BACKBONES = ("postln", "preln", "realformer", "realformer_mean")
# path-ablation key -> backbone; "all" and "postln" are the main comparison's runs
ABLATION = {"postln": "postln", "encoder": "realformer_encoder", "decoder": "realformer_decoder",
            "cross": "realformer_cross", "all": "realformer"}
VARIANTS = BACKBONES + ("realformer_mean", "realformer_preln", "realformer_encoder", "realformer_decoder",
                       "realformer_cross")
BACKBONE_DESCRIPTIONS = {
    "postln": "fairseq `transformer` (Post-LN)",
    "preln": "fairseq `transformer` + `--encoder-normalize-before --decoder-normalize-before` (Pre-LN)",
    "realformer": "`realformer_transformer` (Post-LN, residual attention on encoder, decoder and cross paths)",
    "realformer_mean": "`realformer_transformer`, all three paths, running mean (`--residual-attention-mode mean`)",
    "realformer_preln": "`realformer_transformer` + `--encoder-normalize-before --decoder-normalize-before` "
                        "(Pre-LN, residual attention on encoder, decoder and cross paths)",
    "realformer_encoder": "`realformer_transformer`, residual attention on the encoder self-attention only",
    "realformer_decoder": "`realformer_transformer`, residual attention on the decoder self-attention only",
    "realformer_cross": "`realformer_transformer`, residual attention on the encoder-decoder attention only",
}
# layers (encoder = decoder), embedding dim, FFN dim, heads
SIZES = {
    "small": (3, 256, 512, 4),     # the CPU recipe
    "iwslt": (6, 512, 1024, 4),    # transformer_iwslt_de_en
    "base": (6, 512, 2048, 8),     # transformer (base) / transformer_wmt_en_de
}
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the realformer_nmt package
REPO = fairseq_runs.REPO  # committed results name paths relative to it


def backbone_flags(name, residual_mode="sum"):
    """The only fairseq-train flags that differ between backbones (``residual_mode`` is the
    mode of ``realformer`` and the single-path variants; ``realformer_mean`` is always mean)."""
    if name == "postln":
        return ["--arch", "transformer"]
    if name == "preln":
        return ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before"]
    paths = {"realformer": "encoder,decoder,cross", "realformer_mean": "encoder,decoder,cross",
             "realformer_preln": "encoder,decoder,cross",
             "realformer_encoder": "encoder", "realformer_decoder": "decoder", "realformer_cross": "cross"}
    if name in paths:
        mode = "mean" if name == "realformer_mean" else residual_mode
        flags = ["--arch", "realformer_transformer", "--residual-attention-paths", paths[name],
                 "--residual-attention-mode", mode]
        if name == "realformer_preln":
            flags += ["--encoder-normalize-before", "--decoder-normalize-before"]
        return flags
    raise ConfigError(f"--backbones: unknown backbone {name!r} (choose from {', '.join(VARIANTS)})")


@dataclass
class Recipe:
    """Everything every backbone shares. ``train_flags`` / ``generate_flags`` turn it into
    fairseq flags; dims are always passed explicitly so all backbones get identical sizes."""

    size: str = "small"
    layers: int = None
    embed_dim: int = None
    ffn_dim: int = None
    heads: int = None
    lr: float = 1e-3
    warmup_updates: int = 400
    max_update: int = 1800
    max_minutes: float = 0.0
    max_tokens: int = 2048
    dropout: float = 0.1
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    validate_interval_updates: int = 0
    device: str = "cpu"
    fp16: bool = None            # None: on with --device cuda, off on cpu
    select_by_bleu: bool = False
    beam: int = 5
    log_interval: int = 50
    extra: list = field(default_factory=list)

    def __post_init__(self):
        if self.size not in SIZES:
            raise ConfigError(f"--size must be one of {', '.join(SIZES)}, not {self.size!r}")
        defaults = dict(zip(("layers", "embed_dim", "ffn_dim", "heads"), SIZES[self.size]))
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.fp16 = fairseq_runs.resolve_fp16(self.device, self.fp16)
        if self.max_update < 1 and self.max_minutes <= 0:
            raise ConfigError("give a budget: --max-update N (N >= 1) and/or --max-minutes M")
        if self.embed_dim % self.heads:
            raise ConfigError(f"--embed-dim {self.embed_dim} is not divisible by --heads {self.heads}")

    def model_flags(self, corpus=None):
        flags = []
        for side in ("encoder", "decoder"):
            flags += [f"--{side}-layers", self.layers, f"--{side}-embed-dim", self.embed_dim,
                      f"--{side}-ffn-embed-dim", self.ffn_dim, f"--{side}-attention-heads", self.heads]
        joined = (corpus or DEFAULT_CORPUS)["joined_dictionary"]  # IWSLT'14 has one dictionary per side
        return [str(f) for f in flags] + ["--share-all-embeddings" if joined else "--share-decoder-input-output-embed"]

    def train_flags(self, lr=None):
        flags = [
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", self.clip_norm,
            "--lr", lr if lr is not None else self.lr, "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", self.warmup_updates, "--warmup-init-lr", "1e-07",
            "--dropout", self.dropout, "--weight-decay", self.weight_decay,
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", self.label_smoothing,
            "--max-tokens", self.max_tokens, "--max-update", max(self.max_update, 0),
            "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", self.log_interval,
        ]
        if self.max_minutes > 0:
            flags += ["--stop-time-hours", self.max_minutes / 60]
        if self.validate_interval_updates > 0:
            flags += ["--validate-interval-updates", self.validate_interval_updates]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        if self.select_by_bleu:
            flags += eval_bleu_flags(self.beam)
        return [str(f) for f in flags] + [str(e) for e in self.extra]

    def generate_flags(self, corpus=None):
        """fairseq-generate flags; ``corpus`` (``corpus_info``) gives the BPE to remove and
        the output-length bound (default: Multi30k En->De's sentencepiece, 1.5 x source + 10)."""
        corpus = corpus or DEFAULT_CORPUS
        flags = ["--beam", self.beam, "--batch-size", 128, "--remove-bpe", corpus["bpe"],
                 # bound runaway hypotheses by the corpus's target/source length ratio
                 "--max-len-a", corpus["max_len_a"], "--max-len-b", corpus["max_len_b"], "--user-dir", USER_DIR]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        return [str(f) for f in flags]


def eval_bleu_flags(beam=5):
    """fairseq's translation-task BLEU during validation, selecting checkpoint_best.pt by it."""
    return ["--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-remove-bpe", "sentencepiece",
            "--eval-bleu-args", json.dumps({"beam": beam, "max_len_a": 1.5, "max_len_b": 10}),
            "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


def train_command(data, backbone, recipe, seed, save_dir, residual_mode="sum", lr=None):
    return ([fairseq_runs.fairseq_cli("fairseq-train"), data] + backbone_flags(backbone, residual_mode)
            + recipe.model_flags(corpus_info(data)) + recipe.train_flags(lr)
            + ["--seed", str(seed), "--save-dir", save_dir, "--user-dir", USER_DIR])


# what a data dir prepared before prepare.json recorded languages and conventions means
DEFAULT_CORPUS = {"src": "en", "tgt": "de", "bpe": "sentencepiece", "bleu": "sacrebleu",
                  "length_ratio": None, "max_len_a": 1.5, "max_len_b": 10, "joined_dictionary": True}
LANGUAGE_NAMES = {"en": "En", "de": "De", "fr": "Fr"}
CORPUS_NAMES = {"multi30k": "Multi30k", "synthetic": "Synthetic", "iwslt14": "IWSLT'14"}


def max_len_a(length_ratio):
    """fairseq-generate's ``--max-len-a`` from the corpus's target/source piece ratio: 1.5 x
    the ratio, never below 1.5 (En->De's committed bound), rounded to one decimal."""
    if not length_ratio:
        return 1.5
    return max(1.5, round(1.5 * length_ratio, 1))


def corpus_info(data):
    """Languages, BPE, BLEU convention, raw test files and output-length bounds of ``data``,
    from its ``prepare.json`` (``DEFAULT_CORPUS`` where it records none)."""
    try:
        with open(os.path.join(data, "prepare.json"), encoding="utf-8") as f:
            prepared = json.load(f)
    except (OSError, ValueError):
        prepared = {}
    info = dict(DEFAULT_CORPUS)
    info.update({k: prepared[k] for k in ("src", "tgt", "bpe", "bleu", "length_ratio", "joined_dictionary")
                 if k in prepared})
    info["max_len_a"] = max_len_a(info["length_ratio"]) if "length_ratio" in prepared else 1.5
    test_files = prepared.get("test_files") or {}
    raw_dir = prepared.get("raw_dir")
    info["references"] = test_files.get("tgt") or (os.path.join(raw_dir, f"test.{info['tgt']}") if raw_dir else None)
    corpus = prepared.get("settings", {}).get("corpus", "multi30k")
    info["title"] = (f"{CORPUS_NAMES.get(corpus, corpus)} "
                     f"{LANGUAGE_NAMES.get(info['src'], info['src'])}->{LANGUAGE_NAMES.get(info['tgt'], info['tgt'])}")
    return info


def test_references(data, references=None):
    """Raw test references: ``references`` or the target-side test file ``data/prepare.json``
    names (``test_files.tgt``, or ``<raw_dir>/test.<tgt>``)."""
    info = corpus_info(data)
    for name in (f"dict.{info['src']}.txt", f"dict.{info['tgt']}.txt"):
        if not os.path.exists(os.path.join(data, name)):
            raise DataError(f"--data {data} has no {name}: prepare it with scripts/prepare_data.py")
    if references is None:
        references = info["references"]
        if references is None:
            raise DataError(f"--data {data} has no prepare.json naming its raw text: pass --references FILE")
    if not os.path.isfile(references):
        raise DataError(f"test references {references} not found (pass --references FILE)")
    return references


# --------------------------------------------------------------------------------------
# One run: train (resumably), then decode + score the best checkpoint
# --------------------------------------------------------------------------------------

def run_one(data, references, backbone, recipe, seed, run_dir, residual_mode="sum", lr=None,
            env=None, log=print):
    """Train one backbone/seed in ``run_dir`` and score its best checkpoint; return the result.

    The result (``run_dir/result.json``) holds the training record of
    ``fairseq_runs.train_resumable`` plus ``bleu``, ``best_valid_loss``, ``sacrebleu``,
    ``signature``, ``train_seconds``, ``decode_seconds`` and ``checkpoint``. A diverged run is
    not decoded (its ``bleu`` is None).
    """
    label = f"[{backbone} seed {seed}{'' if lr is None else f' lr {lr:g}'}] "
    done = fairseq_runs.read_json(os.path.join(run_dir, "result.json"))
    cmd = train_command(data, backbone, recipe, seed, run_dir, residual_mode, lr)
    if done is not None and fairseq_runs.same_recipe(done.get("command"), cmd):
        log(f"{label}already done: reusing {os.path.join(run_dir, 'result.json')}")
        return dict(done, run_dir=run_dir)
    train = fairseq_runs.train_resumable(cmd, run_dir, label, log, recipe.max_update, env)
    checkpoint = os.path.join(run_dir, "checkpoint_best.pt")
    finite = [rec for rec in train["curve"] if math.isfinite(rec["loss"])]
    result = dict(train, backbone=backbone, seed=seed, lr=lr if lr is not None else recipe.lr,
                  train_seconds=train["seconds"],
                  best_valid_loss=min(rec["loss"] for rec in finite) if finite else None,
                  final_valid_loss=train["curve"][-1]["loss"] if train["curve"] else None,
                  bleu=None, sacrebleu=None, signature=None, decode_seconds=None,
                  checkpoint=os.path.abspath(checkpoint))
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
    log(f"{label}DONE: {train['status']}{' (' + train['reason'] + ')' if train['reason'] else ''}, "
        f"updates {train['updates']}, best valid loss {_fmt(result['best_valid_loss'])}, "
        f"test BLEU {_fmt(result['bleu'])}, train {train['seconds']:.0f}s")
    return dict(fairseq_runs.finite_or_none(result), run_dir=run_dir)


def run_hypotheses(result):
    """The detokenized test hypotheses of a scored run, in corpus order (None if not decoded)."""
    path = os.path.join(result["run_dir"], "generate.txt")
    if result.get("bleu") is None or not os.path.exists(path):
        return None  # not decoded, or a record reused without its decode output
    hyps = fairseq_runs.parse_generate_output(fairseq_runs.read_log(path))
    return [hyps[i] for i in range(len(hyps))]


def paired_bootstrap(baseline, system, references, samples=1000, bleu_args=None):
    """sacreBLEU's paired bootstrap resampling (Koehn 2004) of ``system`` against ``baseline``
    on the same sentences: ``{"p_value", "delta_bleu", "baseline_bleu", "system_bleu",
    "system_ci95", "signature"}``. The p-value is sacreBLEU's ``--paired-bs`` (as Moses'
    bootstrap script): the share of resamples whose absolute BLEU difference, centred on
    its mean over the resamples, exceeds the observed absolute difference ((count + 1) /
    (resamples + 1)); the resamples are seeded (SACREBLEU_SEED, default 12345), so the test
    is repeatable."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if len(baseline) != len(references) or len(system) != len(references):
        raise DataError(f"paired test needs one hypothesis per reference: {len(baseline)} and "
                        f"{len(system)} hypotheses for {len(references)} references")
    signatures, scores = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU(**(bleu_args or {}))},
                                    [references], test_type="bs", n_samples=samples)()
    base, other = scores["BLEU"]
    return {"p_value": float(other.p_value), "delta_bleu": round(other.score - base.score, 2),
            "baseline_bleu": round(base.score, 2), "system_bleu": round(other.score, 2),
            "system_ci95": round(float(other.ci), 2) if other.ci is not None else None,
            "signature": str(signatures["BLEU"])}


def paired_vs(baseline_runs, runs, references, samples=1000):
    """One paired bootstrap test per seed: ``[{"seed", "p_value", "delta_bleu", ...}]``
    (seeds where either run was not decoded are left out)."""
    by_seed = {r["seed"]: r for r in baseline_runs}
    out = []
    for r in runs:
        base = by_seed.get(r["seed"])
        base_hyps, hyps = (run_hypotheses(base) if base else None), run_hypotheses(r)
        if base_hyps is None or hyps is None:
            continue
        refs, bleu_args = fairseq_runs.paired_test_references(r, references)  # the headline's BLEU
        out.append(dict(seed=r["seed"], **paired_bootstrap(base_hyps, hyps, refs, samples, bleu_args)))
    return out


def save_hypotheses(results, folder):
    """Copy each decoded run's hypotheses (corpus order) to ``folder/<backbone>_seed<k>.txt``,
    so the BLEU scores and paired tests can be checked from the repository alone."""
    os.makedirs(folder, exist_ok=True)
    for r in results:
        hyps = run_hypotheses(r)
        if hyps is not None:
            with open(os.path.join(folder, f"{r['backbone']}_seed{r['seed']}.txt"), "w", encoding="utf-8") as f:
                f.write("".join(h + "\n" for h in hyps))


def _fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


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


def summarize_backbone(results, backbone, residual_mode):
    bleus = [r["bleu"] for r in results]
    losses = [r["best_valid_loss"] for r in results]
    curves = [[[rec["update"], rec["loss"]] for rec in r["curve"]] for r in results]
    mean_curve = fairseq_runs.mean_curve(curves)
    finite_bleus = [b for b in bleus if b is not None]
    finite_losses = [v for v in losses if v is not None]
    return {
        "bleu": round(statistics.mean(finite_bleus), 2) if finite_bleus else None,
        "bleu_std": round(statistics.stdev(finite_bleus), 2) if len(finite_bleus) > 1 else None,
        "bleu_per_seed": bleus,
        "valid_loss": round(statistics.mean(finite_losses), 4) if finite_losses else None,
        "valid_loss_per_seed": losses,
        "updates": min(r["updates"] for r in results),
        "seeds": [r["seed"] for r in results],
        "status_per_seed": [r["status"] for r in results],
        "curve": [[u, round(m, 4)] for u, m, _, _ in mean_curve],
        "curve_min_max": [[u, round(lo, 4), round(hi, 4)] for u, _, lo, hi in mean_curve],
        "curve_per_seed": curves,
        "train_seconds_per_seed": [r["train_seconds"] for r in results],
        "decode_seconds_per_seed": [r["decode_seconds"] for r in results],
        "checkpoints": [r["checkpoint"] for r in results],
        "logs": [r["log"] for r in results],
        "flags": backbone_flags(backbone, residual_mode),
        "description": BACKBONE_DESCRIPTIONS[backbone],
        # beside a tokenized-BLEU headline (IWSLT'14): each seed's lowercased sacreBLEU of the detokenized output
        **({"sacrebleu_per_seed": [r.get("sacrebleu") for r in results]}
           if any(r.get("bleu_convention") == "tokenized" for r in results) else {}),
    }


def recipe_record(recipe, data, references, backbones, residual_mode, seeds):
    example = train_command(data, backbones[0], recipe, seeds[0], "<run_dir>", residual_mode)
    return {
        "settings": asdict(recipe),
        "shared_train_flags": recipe.model_flags(corpus_info(data)) + recipe.train_flags(),
        "backbone_flags": {b: backbone_flags(b, residual_mode) for b in backbones},
        "generate_flags": recipe.generate_flags(corpus_info(data)),
        "corpus": {k: v for k, v in corpus_info(data).items() if k not in ("references", "title")},
        "example_train_command": fairseq_runs.quote(example),
        "seeds": list(seeds),
        "data": os.path.abspath(data),
        "references": os.path.abspath(references),
        "scoring": fairseq_runs.BLEU_CONVENTIONS[fairseq_runs.check_convention(corpus_info(data)["bleu"])]
                   + f" (fairseq-generate --remove-bpe {corpus_info(data)['bpe']}); best checkpoint by "
                   + ("validation BLEU" if recipe.select_by_bleu else "validation loss"),
    }


def _check_backbones(backbones):
    if not backbones:
        raise ConfigError("--backbones: give at least one backbone")
    for b in backbones:
        backbone_flags(b)
    if len(set(backbones)) != len(backbones):
        raise ConfigError("--backbones: a backbone is listed twice")


def _train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, tag):
    """Train and score every ``(key, backbone, seed, run_dir, recipe_or_None, lr)`` in ``specs``,
    ``jobs`` at a time; returns ``{key: result}``."""
    threads = fairseq_runs.threads_per_job(threads, jobs)
    env = fairseq_runs.cli_env(threads)
    log = fairseq_runs.serialized(log)
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


def parallel_note(jobs, threads):
    """What the machine field says about concurrency (results do not depend on it)."""
    threads = fairseq_runs.threads_per_job(threads, jobs)
    per_run = f"OMP_NUM_THREADS={threads}" if threads else "default threads"
    if jobs == 1:
        return f"one run at a time ({per_run})"
    return f"--jobs {jobs}: {jobs} fairseq trainings at once, {per_run} each (results do not depend on it)"


def compare(data, out, recipe, backbones=BACKBONES, seeds=(1,), residual_mode="sum", references=None,
            results_path=None, machine_note="", threads=None, log=print, title=None, jobs=1,
            bootstrap_samples=1000):
    """Train, decode and score every backbone for every seed; write JSON, MD and PNG.

    ``results_path`` is the path of the JSON file (default ``out/comparison.json``); the
    table and the plot go next to it with ``.md`` and ``.png``, and the hypotheses of every
    run in ``<stem>_hyps/``. With ``postln`` among the backbones, every other backbone gets
    ``paired_vs_postln``: sacreBLEU's paired bootstrap test against Post-LN of the same
    seed. Returns the summary dict.
    """
    _check_backbones(backbones)
    references = test_references(data, references)
    # seeds outermost: an early stop still leaves comparable backbones
    specs = [((b, seed), b, seed, os.path.join(out, b, f"seed{seed}"), None, None)
             for seed in seeds for b in backbones]
    runs = _train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "compare")
    results = {b: [runs[(b, seed)] for seed in seeds] for b in backbones}
    summary = {b: summarize_backbone(results[b], b, residual_mode) for b in backbones}
    refs = _read_lines(references)
    for reference in ("postln", "preln"):
        if reference not in backbones:
            continue
        for b in backbones:
            if b != reference and (reference == "postln" or b == "realformer_preln"):
                summary[b][f"paired_vs_{reference}"] = paired_vs(results[reference], results[b], refs,
                                                                 bootstrap_samples)
    signatures = {r["signature"] for rs in results.values() for r in rs if r["signature"]}
    summary.update(
        title=title or corpus_info(data)["title"],
        recipe=recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        paired_test=PAIRED_TEST_NOTE.format(samples=bootstrap_samples),
        machine=machine_description(_join(parallel_note(jobs, threads), machine_note)),
        out=os.path.abspath(out),
    )
    results_path = results_path or os.path.join(out, "comparison.json")
    save_hypotheses([r for rs in results.values() for r in rs], os.path.splitext(results_path)[0] + "_hyps")
    write_outputs(summary, results_path, comparison_markdown, plot_comparison)
    log(f"[compare] wrote {results_path} (+ .md, .png, _hyps/)")
    return summary


PAIRED_TEST_NOTE = ("sacreBLEU paired bootstrap resampling ({samples} resamples, seed 12345) of each seed's "
                    "test hypotheses against Post-LN's of the same seed, on the same sentences; p < 0.05 "
                    "means that seed's BLEU difference is unlikely to come from the choice of test sentences "
                    "(it says nothing about seed-to-seed variation, which bleu_std shows)")


def _read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _join(*notes):
    return "; ".join(n for n in notes if n)


# --------------------------------------------------------------------------------------
# The learning-rate stability sweep
# --------------------------------------------------------------------------------------

def classify(result, reference_loss, margin):
    """``ok`` / ``diverged`` / ``stalled`` for one sweep run (see the module docstring)."""
    if result["status"] == "diverged" or result["best_valid_loss"] is None:
        return "diverged"
    if reference_loss is not None and result["best_valid_loss"] > reference_loss + margin:
        return "stalled"
    return "ok"


def lr_sweep(data, out, recipe, lrs, backbones=BACKBONES, seeds=(1,), residual_mode="sum", normal_lr=None,
             margin=1.0, references=None, results_path=None, machine_note="", threads=None, log=print,
             title=None, jobs=1):
    """Train every backbone at every learning rate in ``lrs`` (nothing else changes).

    ``normal_lr`` (default: the smallest of ``lrs``) is the reference: a run at another
    learning rate is ``stalled`` when its best valid loss exceeds the same backbone's (and
    seed's) best valid loss at ``normal_lr`` by more than ``margin``.
    """
    _check_backbones(backbones)
    lrs = sorted(set(float(lr) for lr in lrs))
    if not lrs:
        raise ConfigError("--lrs: give at least one learning rate")
    normal_lr = float(normal_lr) if normal_lr is not None else lrs[0]
    if normal_lr not in lrs:
        raise ConfigError(f"--normal-lr {normal_lr:g} is not one of --lrs")
    references = test_references(data, references)
    order = [normal_lr] + [lr for lr in lrs if lr != normal_lr]  # the reference runs first
    specs = [((backbone, lr, seed), backbone, seed, os.path.join(out, f"lr{lr:g}", backbone, f"seed{seed}"),
              None, lr) for seed in seeds for lr in order for backbone in backbones]
    runs = _train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "lr-sweep")
    table = {}
    for backbone in backbones:
        table[backbone] = {}
        for lr in lrs:
            entries = []
            for seed in seeds:
                r = runs[(backbone, lr, seed)]
                ref = runs[(backbone, normal_lr, seed)]["best_valid_loss"]
                entries.append({
                    "seed": seed, "outcome": classify(r, ref, margin), "status": r["status"],
                    "reason": r["reason"], "bleu": r["bleu"], "best_valid_loss": r["best_valid_loss"],
                    "final_valid_loss": r["final_valid_loss"], "updates": r["updates"],
                    "train_seconds": r["train_seconds"], "decode_seconds": r["decode_seconds"],
                    "curve": [[rec["update"], rec["loss"]] for rec in r["curve"]],
                    "checkpoint": r["checkpoint"], "log": r["log"],
                })
            table[backbone][f"{lr:g}"] = entries
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    summary = {
        "title": title or corpus_info(data)["title"],
        "runs": table,
        "lrs": lrs,
        "normal_lr": normal_lr,
        "divergence_rule": (
            "diverged: fairseq stopped on NaN/inf (FloatingPointError: NaN/inf gradients, or fp16 "
            "'Minimum loss scale reached') or no finite validation loss; stalled: finished, but its best "
            f"valid loss is more than {margin:g} above the same backbone and seed at lr {normal_lr:g} "
            "(fairseq's label-smoothed loss, base 2); ok: neither"),
        "margin": margin,
        "recipe": recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(_join(parallel_note(jobs, threads), machine_note)),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, "lr_stress.json")
    write_outputs(summary, results_path, sweep_markdown, plot_sweep)
    log(f"[lr-sweep] wrote {results_path} (+ .md, .png)")
    return summary


# --------------------------------------------------------------------------------------
# Depth stress test and per-path ablation
# --------------------------------------------------------------------------------------

DEPTH_SIZE = dict(embed_dim=128, ffn_dim=512, heads=4)  # narrow: where depth, not width, is stressed


def depth_stress(data, out, recipe, depths=(6, 12), backbones=DEPTH_BACKBONES, seeds=(1, 2), margin=1.0,
                 residual_mode="sum", references=None, results_path=None, machine_note="", threads=None,
                 log=print, title=None, jobs=1):
    """Train every backbone at ``L+L`` layers for every L in ``depths`` (``recipe.layers`` is
    replaced, nothing else changes) and mark each run ``ok`` / ``stalled`` / ``diverged``.

    The lr sweep's rule, with the best run of the same seed as the reference: ``diverged``
    when fairseq stopped on NaN/inf or no validation loss is finite; ``stalled`` when its
    best valid loss is more than ``margin`` above the lowest best valid loss among all runs
    (every depth and backbone) of that seed; ``ok`` otherwise.
    """
    _check_backbones(backbones)
    depths = sorted(set(int(d) for d in depths))
    if not depths or depths[0] < 1:
        raise ConfigError("--depths: give one or more layer counts >= 1")
    references = test_references(data, references)
    specs = [((depth, b, seed), b, seed, os.path.join(out, f"L{depth}", b, f"seed{seed}"),
              replace(recipe, layers=depth), None) for seed in seeds for depth in depths for b in backbones]
    runs = _train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "depth-stress")
    reference = {}
    for seed in seeds:
        losses = [r["best_valid_loss"] for (_, _, s), r in runs.items()
                  if s == seed and r["status"] == "finished" and r["best_valid_loss"] is not None]
        reference[seed] = min(losses) if losses else None
    table = {}
    for depth in depths:
        table[str(depth)] = {}
        for b in backbones:
            rs = [runs[(depth, b, seed)] for seed in seeds]
            entry = summarize_backbone(rs, b, residual_mode)
            entry["fairseq_status_per_seed"] = entry["status_per_seed"]
            entry["status_per_seed"] = [classify(r, reference[r["seed"]], margin) for r in rs]
            entry["reason_per_seed"] = [r["reason"] for r in rs]
            table[str(depth)][b] = entry
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    record = recipe_record(replace(recipe, layers=depths[0]), data, references, backbones, residual_mode, seeds)
    record["depths"] = depths
    record["note"] = (f"--encoder-layers and --decoder-layers are L for L in {depths}; shared_train_flags "
                      f"show L = {depths[0]}")
    summary = {
        "title": title or corpus_info(data)["title"],
        "depths": table,
        "backbones": list(backbones),
        "reference_loss_per_seed": {str(seed): loss for seed, loss in reference.items()},
        "rule": ("diverged: fairseq stopped on NaN/inf (FloatingPointError: NaN/inf gradients, or fp16 "
                 "'Minimum loss scale reached') or no finite validation loss; stalled: finished, but its best "
                 f"valid loss is more than {margin:g} above the lowest best valid loss of all runs of the same "
                 "seed (fairseq's label-smoothed loss, base 2); ok: neither"),
        "margin": margin,
        "recipe": record,
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(_join(parallel_note(jobs, threads), machine_note)),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, "depth_stress.json")
    write_outputs(summary, results_path, depth_markdown, plot_depth)
    log(f"[depth-stress] wrote {results_path} (+ .md, .png)")
    return summary


def path_ablation(data, out, recipe, seeds=(1, 2), residual_mode="sum", references=None, results_path=None,
                  machine_note="", threads=None, log=print, title=None, jobs=1,
                  bootstrap_samples=1000):
    """Which residual path matters: RealFormer with residual attention on one path alone
    (``encoder``, ``decoder``, ``cross``), on all three (``all``) and Post-LN (``postln``,
    paths ``none`` being fairseq's ``transformer``), one recipe.

    The runs share ``out`` with the main comparison: ``all`` and ``postln`` are its
    ``realformer`` and ``postln`` runs, reused when the recipe is the same. Each setting but
    Post-LN gets ``paired_vs_postln`` per seed.
    """
    references = test_references(data, references)
    specs = [((key, seed), backbone, seed, os.path.join(out, backbone, f"seed{seed}"), None, None)
             for seed in seeds for key, backbone in ABLATION.items()]
    runs = _train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "path-ablation")
    refs = _read_lines(references)
    summary = {}
    for key, backbone in ABLATION.items():
        rs = [runs[(key, seed)] for seed in seeds]
        entry = summarize_backbone(rs, backbone, residual_mode)
        entry["backbone"] = backbone
        if key != "postln":
            entry["paired_vs_postln"] = paired_vs([runs[("postln", seed)] for seed in seeds], rs, refs,
                                                  bootstrap_samples)
        summary[key] = entry
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    summary.update(
        title=title or corpus_info(data)["title"],
        recipe=recipe_record(recipe, data, references, list(ABLATION.values()), residual_mode, seeds),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        paired_test=PAIRED_TEST_NOTE.format(samples=bootstrap_samples),
        machine=machine_description(_join(parallel_note(jobs, threads), machine_note)),
        out=os.path.abspath(out),
    )
    results_path = results_path or os.path.join(out, "path_ablation.json")
    save_hypotheses([runs[(key, seed)] for key in ("encoder", "decoder", "cross") for seed in seeds],
                    os.path.splitext(results_path)[0] + "_hyps")
    write_outputs(summary, results_path, ablation_markdown, plot_ablation)
    log(f"[path-ablation] wrote {results_path} (+ .md, .png, _hyps/)")
    return summary


# --------------------------------------------------------------------------------------
# JSON, Markdown, PNG
# --------------------------------------------------------------------------------------

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


def _seconds(s):
    return "n/a" if s is None else f"{s / 60:.1f} min"


def _bleu_cell(s, n_seeds):
    bleu = _fmt(s["bleu"]) + (f" ± {s['bleu_std']:.2f}" if s["bleu_std"] is not None else "")
    if n_seeds == 1:
        bleu += " (1 seed)"
    diverged = [seed for seed, st in zip(s["seeds"], s["status_per_seed"]) if st not in ("finished", "ok")]
    if diverged:
        bleu += f" (not ok: seeds {diverged})"
    return bleu


def _paired_cell(s, key="paired_vs_postln"):
    tests = s.get(key)
    if not tests:
        return "—"
    return ", ".join(f"s{t['seed']}: {t['delta_bleu']:+.2f} (p={t['p_value']:.3f})" for t in tests)


def comparison_markdown(summary):
    backbones = [b for b in MAIN_ORDER if b in summary]
    n_seeds = len(summary[backbones[0]]["seeds"])
    settings = summary["recipe"]["settings"]
    paired = any(summary[b].get("paired_vs_postln") for b in backbones)
    paired_pre = any(summary[b].get("paired_vs_preln") for b in backbones)
    lines = [f"# {summary['title']}: Post-LN vs Pre-LN vs RealFormer", "",
             f"Test BLEU ({fairseq_runs.BLEU_LABELS[summary['recipe'].get('corpus', {}).get('bleu', 'sacrebleu')]}) "
             "of the best checkpoint by "
             f"{'validation BLEU' if settings['select_by_bleu'] else 'validation loss'}, beam {settings['beam']}; "
             + ("**one seed**, so differences of a few tenths are within seed noise." if n_seeds == 1
                else f"mean ± standard deviation over {n_seeds} seeds (seeds {summary[backbones[0]]['seeds']})."),
             "",
             "| backbone | test BLEU | BLEU per seed | best valid loss (mean) | valid loss per seed | "
             + ("vs Post-LN per seed: ΔBLEU (paired bootstrap p) | " if paired else "")
             + ("vs Pre-LN per seed: ΔBLEU (paired bootstrap p) | " if paired_pre else "")
             + "updates | train time per seed |",
             "| --- | --- | --- | --- | --- | " + ("--- | " if paired else "") + ("--- | " if paired_pre else "")
             + "--- | --- |"]
    for b in backbones:
        s = summary[b]
        lines.append(
            f"| {b} | {_bleu_cell(s, n_seeds)} | {', '.join(_fmt(x) for x in s['bleu_per_seed'])} "
            f"| {_fmt(s['valid_loss'], 3)} | {', '.join(_fmt(x, 3) for x in s['valid_loss_per_seed'])} | "
            + (f"{_paired_cell(s)} | " if paired else "")
            + (f"{_paired_cell(s, 'paired_vs_preln')} | " if paired_pre else "")
            + f"{s['updates']} | {', '.join(_seconds(t) for t in s['train_seconds_per_seed'])} |")
    lines += ["", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        lines.append(f"- `{b}`: {summary[b]['description']}: `{' '.join(summary[b]['flags'])}`")
    lines += _recipe_lines(summary)
    return "\n".join(lines)


def _recipe_lines(summary):
    lines = ["", "Shared fairseq-train flags:", "", "```", " ".join(summary["recipe"]["shared_train_flags"]),
             "```", "", f"Decoding: `fairseq-generate {' '.join(summary['recipe']['generate_flags'])}`", "",
             f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", ""]
    if summary.get("paired_test"):
        lines += [f"Paired test: {summary['paired_test']}.", ""]
    lines += [f"Machine: {summary['machine']}. Wall times depend on the load of the machine; the "
              "budget is a fixed number of updates, identical for every backbone.", ""]
    return lines


def depth_markdown(summary):
    backbones = summary["backbones"]
    settings = summary["recipe"]["settings"]
    seeds = summary["recipe"]["seeds"]
    lines = [f"# {summary['title']}: depth stress test (narrow deep models)", "",
             f"`L+L` layers, d={settings['embed_dim']}, FFN {settings['ffn_dim']}, {settings['heads']} heads; "
             f"lr {settings['lr']:g}, {settings['warmup_updates']} warmup updates, {settings['max_update']} updates, "
             f"seeds {seeds}. Each cell: outcome per seed; test BLEU mean ± sd (per seed); best valid loss "
             "mean (per seed).", ""]
    for depth, row in summary["depths"].items():
        lines += [f"## {depth}+{depth} layers", "",
                  "| backbone | outcome per seed | test BLEU | BLEU per seed | best valid loss | valid loss per seed |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for b in backbones:
            e = row[b]
            lines.append(f"| {b} | {', '.join(e['status_per_seed'])} | {_bleu_cell(e, len(seeds))} "
                         f"| {', '.join(_fmt(x) for x in e['bleu_per_seed'])} | {_fmt(e['valid_loss'], 3)} "
                         f"| {', '.join(_fmt(x, 3) for x in e['valid_loss_per_seed'])} |")
        lines.append("")
    lines += [f"Rule: {summary['rule']}. Reference (lowest best valid loss) per seed: "
              + ", ".join(f"seed {k}: {_fmt(v, 3)}" for k, v in summary["reference_loss_per_seed"].items()) + ".",
              "", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        e = next(iter(summary["depths"].values()))[b]
        lines.append(f"- `{b}`: {e['description']}: `{' '.join(e['flags'])}`")
    lines += ["", f"Depths: {summary['recipe']['note']}."] + _recipe_lines(summary)
    return "\n".join(lines)


def ablation_markdown(summary):
    keys = [k for k in ABLATION if k in summary]
    n_seeds = len(summary[keys[0]]["seeds"])
    lines = [f"# {summary['title']}: which residual path matters", "",
             f"RealFormer with residual attention on one path, on all three, and Post-LN (paths `none`); "
             f"one recipe, seeds {summary[keys[0]]['seeds']}. Test BLEU mean ± sd over seeds.", "",
             "| paths | backbone | test BLEU | BLEU per seed | best valid loss (mean) | valid loss per seed "
             "| vs Post-LN per seed: ΔBLEU (paired bootstrap p) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for k in keys:
        s = summary[k]
        lines.append(f"| {k} | `{s['backbone']}` | {_bleu_cell(s, n_seeds)} "
                     f"| {', '.join(_fmt(x) for x in s['bleu_per_seed'])} | {_fmt(s['valid_loss'], 3)} "
                     f"| {', '.join(_fmt(x, 3) for x in s['valid_loss_per_seed'])} | {_paired_cell(s)} |")
    lines += ["", "Flags of each setting (the only ones that differ):", ""]
    for k in keys:
        lines.append(f"- `{k}`: `{' '.join(summary[k]['flags'])}`")
    lines += _recipe_lines(summary)
    return "\n".join(lines)


def sweep_markdown(summary):
    backbones = [b for b in BACKBONES if b in summary["runs"]]
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    settings = summary["recipe"]["settings"]
    n_seeds = len(summary["recipe"]["seeds"])
    lines = [f"# {summary['title']}: learning-rate stability (He et al. 2021, Fig. 3)", "",
             f"Each cell: outcome, test BLEU, best valid loss (updates; train wall time). Budget "
             f"{settings['max_update']} updates, warmup {settings['warmup_updates']}, everything but the "
             f"peak learning rate identical; {'one seed' if n_seeds == 1 else f'{n_seeds} seeds'}.", "",
             "| backbone | " + " | ".join(f"lr {lr}" + (" (normal)" if float(lr) == summary["normal_lr"] else "")
                                        for lr in lrs) + " |",
             "| --- |" + " --- |" * len(lrs)]
    for b in backbones:
        cells = []
        for lr in lrs:
            parts = []
            for e in summary["runs"][b][lr]:
                parts.append(f"**{e['outcome']}** BLEU {_fmt(e['bleu'])}, loss {_fmt(e['best_valid_loss'], 3)} "
                             f"({e['updates']} upd; {_seconds(e['train_seconds'])})")
            cells.append("<br>".join(parts))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines += ["", f"Rule: {summary['divergence_rule']}.", "",
              "Shared fairseq-train flags (`--lr` replaced per column):", "", "```",
              " ".join(summary["recipe"]["shared_train_flags"]), "```", "",
              f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", "",
              f"Machine: {summary['machine']}.", ""]
    return "\n".join(lines)


_COLORS = {"postln": "tab:blue", "preln": "tab:orange", "realformer": "tab:green", "realformer_mean": "tab:red",
           "realformer_preln": "tab:olive",
           "realformer_encoder": "tab:purple", "realformer_decoder": "tab:brown", "realformer_cross": "tab:pink"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(summary, path):
    """Validation loss against updates, one line per backbone (mean, min-max band over seeds);
    the right panel zooms on the second half of training, where the backbones separate."""
    plt = _pyplot()
    backbones = [b for b in MAIN_ORDER if b in summary]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    last = max([u for b in backbones for u, _ in summary[b]["curve"]] or [0])
    for zoom, ax in enumerate(axes):
        for b in backbones:
            s = summary[b]
            keep = [i for i, (u, _) in enumerate(s["curve"]) if not zoom or u >= last / 2]
            if not keep:
                continue
            xs, ys = [s["curve"][i][0] for i in keep], [s["curve"][i][1] for i in keep]
            label = f"{b} (test BLEU {_fmt(s['bleu'])}" + (f" ± {s['bleu_std']:.2f})" if s["bleu_std"] is not None
                                                           else ", 1 seed)")
            ax.plot(xs, ys, marker="o", markersize=3, color=_COLORS[b], label=label)
            if len(s["seeds"]) > 1:
                band = [s["curve_min_max"][i] for i in keep]
                ax.fill_between([u for u, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                                color=_COLORS[b], alpha=0.2)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.set_title("second half (zoom)" if zoom else "validation loss"
                     + ("" if len(summary[backbones[0]]["seeds"]) == 1 else " (mean, min-max over seeds)"))
    axes[0].set_ylabel("validation loss (label-smoothed, base 2)")
    axes[0].legend()
    fig.suptitle(f"{summary['title']}: Post-LN vs Pre-LN vs RealFormer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(summary, path):
    plt = _pyplot()
    backbones = [b for b in BACKBONES if b in summary["runs"]]
    fig, axes = plt.subplots(1, len(backbones), figsize=(4.5 * len(backbones), 4), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    for ax, b in zip(axes[0], backbones):
        for i, lr in enumerate(lrs):
            color = cmap(i / max(1, len(lrs) - 1) * 0.85)
            for e in summary["runs"][b][lr]:
                points = [(u, v) for u, v in e["curve"] if v is not None and math.isfinite(v)]
                label = f"lr {lr}: {e['outcome']}" if e["seed"] == summary["runs"][b][lr][0]["seed"] else None
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, color=color, label=label)
                    if e["outcome"] != "ok":
                        ax.plot(*points[-1], marker="x", markersize=10, color="red")
                elif label:
                    ax.plot([], [], color=color, label=label + " (no finite valid loss)")
        ax.set_title(b)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss")
    fig.suptitle(f"{summary['title']}: learning-rate stability (x = diverged or stalled)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _curve_with_band(ax, s, color, label):
    """Mean validation curve of one entry, with its min-max band over seeds."""
    if not s["curve"]:
        ax.plot([], [], color=color, label=label + " (no finite valid loss)")
        return
    ax.plot(*zip(*s["curve"]), marker="o", markersize=2, color=color, label=label)
    if len(s["seeds"]) > 1 and s["curve_min_max"]:
        band = s["curve_min_max"]
        ax.fill_between([u for u, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                        color=color, alpha=0.2)


def plot_depth(summary, path):
    """One panel per depth: validation loss against updates per backbone (mean, min-max band)."""
    plt = _pyplot()
    depths = list(summary["depths"])
    fig, axes = plt.subplots(1, len(depths), figsize=(6 * len(depths), 4.5), squeeze=False, sharey=True)
    for ax, depth in zip(axes[0], depths):
        for b in summary["backbones"]:
            e = summary["depths"][depth][b]
            outcomes = "/".join(e["status_per_seed"])
            _curve_with_band(ax, e, _COLORS[b], f"{b}: {outcomes}, BLEU {_fmt(e['bleu'])}")
        ax.set_title(f"{depth}+{depth} layers")
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss (mean, min-max over seeds)")
    fig.suptitle(f"{summary['title']}: depth stress test")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ablation(summary, path):
    """Test BLEU per path setting (mean ± sd, seeds as dots) and validation loss curves."""
    plt = _pyplot()
    keys = [k for k in ABLATION if k in summary]
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, k in enumerate(keys):
        s = summary[k]
        color = _COLORS[s["backbone"]]
        bars.bar(i, s["bleu"] or 0, yerr=s["bleu_std"] or 0, color=color, alpha=0.6, capsize=4)
        seeds = [b for b in s["bleu_per_seed"] if b is not None]
        bars.scatter([i] * len(seeds), seeds, color="black", s=12, zorder=3)
        _curve_with_band(curves, s, color, k)
    bars.set_xticks(range(len(keys)), keys)
    finite = [b for k in keys for b in summary[k]["bleu_per_seed"] if b is not None]
    if finite:
        bars.set_ylim(min(finite) - 2, max(finite) + 1)
    bars.set_ylabel("test BLEU (mean ± sd; dots: seeds)")
    bars.grid(alpha=0.3, axis="y")
    curves.set_xlabel("updates")
    curves.set_ylabel("validation loss")
    curves.grid(alpha=0.3)
    curves.legend()
    fig.suptitle(f"{summary['title']}: residual attention on one path vs all vs none")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
