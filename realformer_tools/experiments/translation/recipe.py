"""Backbones, the shared recipe and the corpus a translation study trains on.

``backbone_flags`` gives the only fairseq-train flags that differ between backbones;
``Recipe`` everything they share (``train_command`` puts both together); ``corpus_info``
reads a data folder's ``prepare.json`` (languages, BPE, raw test files, length bound).
"""

import json
import math
import os
from dataclasses import dataclass, field

from realformer_nmt.errors import ConfigError, DataError

from ...launch import DATA_FIXES_ENV as DATA_FIXES_SWITCH
from ...plugin_dir import plugin_dir
from .. import fairseq_runs

BACKBONES = ("postln", "preln", "realformer")  # the main comparison's default set
# table and plot order of a comparison
MAIN_ORDER = BACKBONES + ("realformer_preln", "realformer_mean", "preln_vr", "realformer_preln_vr")
ON_PRELN = ("realformer_preln", "preln_vr", "realformer_preln_vr")  # tested against Pre-LN on the same sentences
DEPTH_BACKBONES = ("postln", "preln", "realformer", "realformer_mean", "realformer_preln")


# path-ablation key -> backbone; "all" and "postln" are the main comparison's runs
ABLATION = {"postln": "postln", "encoder": "realformer_encoder", "decoder": "realformer_decoder",
            "cross": "realformer_cross", "all": "realformer"}
VARIANTS = BACKBONES + ("realformer_mean", "realformer_preln", "realformer_encoder", "realformer_decoder",
                       "realformer_cross", "preln_vr", "realformer_preln_vr")
# Value residual (ResFormer, Zhou et al., arXiv 2410.17897) on the encoder and decoder self-attention
# paths, with the learned mix: no source we could check recommends the fixed half mix at a small size.
# ResFormer's code (github.com/Zcchill/Value-Residual-Learning) trains the half mix; the small-model
# speedrun that spread the idea (KellerJordan/modded-nanogpt, Nov 2024, from @Grad62304977) learns one
# convex lambda per layer from 0.5, v = (1 - lambda) v + lambda v1, which is the learned mix here;
# x-transformers learns its mix by default too (a per-token gate). The 3+3-layer, d=256 recipe is far
# below every size they report (docs/internals.md#value-residual).
VALUE_RESIDUAL_MIX = "learned"
VALUE_RESIDUAL_FLAGS = ["--value-residual-paths", "encoder,decoder", "--value-residual-mix", VALUE_RESIDUAL_MIX]
# the value residual study's seed-paired comparisons (backbone, reference), one family (pairs.py)
VALUE_RESIDUAL_PAIRS = (("preln_vr", "preln"), ("realformer_preln_vr", "preln"), ("preln_vr", "realformer_preln"),
                        ("realformer_preln_vr", "realformer_preln"), ("realformer_preln_vr", "preln_vr"))
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
    "preln_vr": "`realformer_transformer`, Pre-LN, no residual attention, value residual (ResFormer) on the encoder "
                "and decoder self-attention, learned mix (one lambda per layer from 0.5, "
                "modded-nanogpt's form; no source we checked recommends the fixed half mix at this size)",
    "realformer_preln_vr": "`realformer_transformer`, Pre-LN, residual attention on encoder, decoder and cross paths "
                           "and value residual on the encoder and decoder self-attention, learned mix (as preln_vr)",
}


# The environment every run of a study has (fairseq-train and fairseq-generate alike), recorded
# in each results JSON: the plugin's data fixes on for every backbone (every sentence batched;
# fairseq alone drops up to 7 per batching), as the committed results were trained.
ENVIRONMENT = {DATA_FIXES_SWITCH: "1"}


def check_environment(record, where):
    """Refuse a record (a results file's recipe, a run's result) trained with another
    environment than :data:`ENVIRONMENT`; one that records none predates the switch, when
    the fixes were always on, and counts as on."""
    recorded = dict(ENVIRONMENT, **(record.get("environment") or {}))
    if recorded != ENVIRONMENT:
        raise ConfigError(f"{where}: its runs were trained with {DATA_FIXES_SWITCH}="
                          f"{recorded.get(DATA_FIXES_SWITCH)!r} where this harness trains every backbone with "
                          f"{DATA_FIXES_SWITCH}=1: the two cannot be mixed")


# layers (encoder = decoder), embedding dim, FFN dim, heads
SIZES = {
    "small": (3, 256, 512, 4),     # the CPU recipe
    "iwslt": (6, 512, 1024, 4),    # transformer_iwslt_de_en
    "base": (6, 512, 2048, 8),     # transformer (base) / transformer_wmt_en_de
}
USER_DIR = plugin_dir()  # the realformer_nmt package
REPO = fairseq_runs.REPO  # committed results name paths relative to it
DEPTH_SIZE = dict(embed_dim=128, ffn_dim=512, heads=4)  # narrow: where depth, not width, is stressed


def backbone_flags(name, residual_mode="sum"):
    """The only fairseq-train flags that differ between backbones (``residual_mode`` is the
    mode of ``realformer`` and the single-path variants; ``realformer_mean`` is always mean)."""
    if name == "postln":
        return ["--arch", "transformer"]
    if name == "preln":
        return ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before"]
    paths = {"realformer": "encoder,decoder,cross", "realformer_mean": "encoder,decoder,cross",
             "realformer_preln": "encoder,decoder,cross", "realformer_preln_vr": "encoder,decoder,cross",
             "realformer_encoder": "encoder", "realformer_decoder": "decoder", "realformer_cross": "cross"}
    if name == "preln_vr":
        return (["--arch", "realformer_transformer", "--residual-attention-paths", "none"] + VALUE_RESIDUAL_FLAGS
                + ["--encoder-normalize-before", "--decoder-normalize-before"])
    if name in paths:
        mode = "mean" if name == "realformer_mean" else residual_mode
        flags = ["--arch", "realformer_transformer", "--residual-attention-paths", paths[name],
                 "--residual-attention-mode", mode]
        if name == "realformer_preln_vr":
            flags += VALUE_RESIDUAL_FLAGS
        if name in ON_PRELN:
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
            "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", self.log_interval,
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
    return ([*fairseq_runs.fairseq_cli("fairseq-train"), data] + backbone_flags(backbone, residual_mode)
            + recipe.model_flags(corpus_info(data)) + recipe.train_flags(lr)
            + ["--seed", str(seed), "--save-dir", save_dir, "--user-dir", USER_DIR])


# what a data dir prepared before prepare.json recorded languages and conventions means
DEFAULT_CORPUS = {"src": "en", "tgt": "de", "bpe": "sentencepiece", "bleu": "sacrebleu",
                  "length_ratio": None, "max_len_a": 1.5, "max_len_b": 10, "joined_dictionary": True}
LANGUAGE_NAMES = {"en": "En", "de": "De", "fr": "Fr"}
CORPUS_NAMES = {"multi30k": "Multi30k", "synthetic": "Synthetic", "iwslt14": "IWSLT'14"}


def max_len_a(length_ratio):
    """fairseq-generate's ``--max-len-a`` from the corpus's target/source piece ratio: 1.5 x
    the ratio rounded to one decimal, the product rounded to one decimal (halves up), never
    below 1.5. En->De (ratio 1.03 -> 1.0) keeps its committed 1.5; En->Fr (1.13 -> 1.1) gets 1.7."""
    if not length_ratio:
        return 1.5
    tenths = math.floor(length_ratio * 10 + 0.5)
    return max(1.5, math.floor(1.5 * tenths + 0.5) / 10)


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
    info["test_sets"] = test_sets(data, prepared, info)
    return info


HEADLINE_TEST_NAMES = {"multi30k": "test_2016_flickr"}  # the name of the split ``test`` where prepare.json has none


def test_sets(data, prepared, info):
    """``[{"split", "name", "references"}]``: every test split of ``data`` that ``prepare.json``
    names (``test_sets``, ``test_set_files``) and whose binaries are there, the headline
    ``test`` first; a folder that names none has ``test`` only (Multi30k's is
    test_2016_flickr)."""
    corpus = prepared.get("settings", {}).get("corpus", "multi30k")
    names = dict(prepared.get("test_sets") or {"test": HEADLINE_TEST_NAMES.get(corpus, "test")})
    files = prepared.get("test_set_files") or {}
    out = [{"split": "test", "name": names.get("test", "test"), "references": info["references"]}]
    pair = f"{info['src']}-{info['tgt']}"
    for split, name in names.items():
        refs = (files.get(split) or {}).get("tgt")
        if split == "test" or not refs:
            continue
        if all(os.path.exists(os.path.join(data, f"{split}.{pair}.{lang}.{ext}"))
               for lang in (info["src"], info["tgt"]) for ext in ("bin", "idx")):
            out.append({"split": split, "name": name, "references": refs})
    return out


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
