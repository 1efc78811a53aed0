"""Google's released RealFormer BERT checkpoints -> a fairseq ``realformer_bert`` checkpoint.

The authors of RealFormer released BERT-Small/Base/Large/xLarge pre-trained with the
official code (google-research ``realformer/realformer.py``) as TF1 checkpoints in zips:
``bert_config.json``, a WordPiece ``vocab.txt`` and ``*.index`` / ``*.data-*`` files.
``convert`` reads them with :mod:`tf_checkpoint` (no TensorFlow) and writes a folder that
``RealFormerBertModel.from_pretrained`` and ``fairseq-train --restore-file`` take:

* ``model.pt``: arch ``realformer_bert_google`` with the sizes, dropout and
  ``use_running_mean`` of ``bert_config.json`` and BERT's numerics (segment embeddings,
  positions from 0, LayerNorm epsilon 1e-12, ``gelu_accurate``), task ``masked_lm``;
* ``dict.txt``: the WordPiece vocabulary in its own order, with BERT's specials on
  fairseq's: ``[CLS]`` -> ``<s>`` (id 0), ``[PAD]`` -> ``<pad>`` (1), ``[SEP]`` -> ``</s>``
  (2), ``[UNK]`` -> ``<unk>`` (3) (fairseq's ``Dictionary`` puts these four first), and
  ``[MASK]`` written as ``<mask>`` in its place; specials are found by their strings;
* ``vocab.txt`` (for ``--bpe wordpiece``, or fairseq's ``--bpe bert``), ``bert_config.json``
  and ``conversion.json`` (what was converted, skipped, and the fairseq flags).

Variables: the 2-D kernels are ``[in, out]`` (a ``Linear`` weight is the transpose); the
official graph only reshapes query/key/value and the attention output to per-head 3-D form,
with head h the h-th block of ``head_dim`` columns (rows for the output), which is
fairseq's layout too. Word embeddings and the MLM output bias are permuted to the
dictionary's order. BERT's pooler + next-sentence classifier become the classification
head ``next_sentence`` (the ``masked_lm_nsp`` task's) with its two classes swapped to that
task's convention (1 = is next; BERT's 0). BERT's MLM transform + tied decoder + bias
become RoBERTa's LM head. Optimizer slots (``*/adam_m``, ``*/adam_v``) and
``global_step`` are skipped and counted; any other variable the model has no place for,
and any variable it needs that is missing, is an error naming them.

This module reads the checkpoints and writes the converted folder; the variable layout
and the mapping onto fairseq (vocabulary, flags, weights) are in ``google_mapping.py``.
"""

import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from typing import Dict, List, Optional, Tuple

import torch

from realformer_nmt.errors import CheckpointFileError, ConfigError
from realformer_nmt.models.realformer_bert.model import GOOGLE_NSP_HEAD

from .google_mapping import (
    ACTIVATIONS,
    MASK,
    SPECIALS,
    VOCAB_FILE,
    GoogleCheckpoint,
    fairseq_flags,
    fairseq_state,
    fairseq_vocabulary,
    finetune_arch_flags,
    model_variables,
)
from .tf_checkpoint import TFCheckpointError, open_checkpoint

logger = logging.getLogger(__name__)

CONFIG_FILE = "bert_config.json"
OPTIMIZER_SLOTS = ("/adam_m", "/adam_v")
BOOKKEEPING = ("global_step",)
# BertConfig's defaults (realformer.py) for keys a bert_config.json leaves out
CONFIG_DEFAULTS = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=16,
    initializer_range=0.02, use_running_mean=False,
)


def _names(names: List[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# --------------------------------------------------------------------------------------
# reading: a zip, a folder or an .index file
# --------------------------------------------------------------------------------------


def _is_needed(name: str) -> bool:
    base = os.path.basename(name)
    return base in (CONFIG_FILE, VOCAB_FILE) or base.endswith(".index") or ".data-" in base


def _extract(zip_path: str, dest: str):
    """The config, vocabulary and checkpoint files of a zip (never outside ``dest``)."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            for info in z.infolist():
                name = os.path.normpath(info.filename)
                if info.is_dir() or not _is_needed(name):
                    continue
                if os.path.isabs(name) or name.startswith(".."):
                    raise CheckpointFileError(f"{zip_path}: unsafe member path {info.filename!r}")
                target = os.path.join(dest, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                logger.info("extracting %s (%.1f MB)", info.filename, info.file_size / 1e6)
                with z.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise CheckpointFileError(f"{zip_path} is not a readable zip file ({e})") from None
    except OSError as e:  # includes zipfile's CRC-32 check of every member
        raise CheckpointFileError(f"cannot extract {zip_path}: {e}") from None


def _find_files(root: str, checkpoint: Optional[str], source: str) -> Tuple[str, str, str]:
    """``(bert_config.json, vocab.txt, checkpoint prefix)`` under ``root``."""
    found: Dict[str, List[str]] = {"config": [], "vocab": [], "index": []}
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            if f == CONFIG_FILE:
                found["config"].append(path)
            elif f == VOCAB_FILE:
                found["vocab"].append(path)
            elif f.endswith(".index"):
                found["index"].append(path[: -len(".index")])
    if checkpoint is not None:
        found["index"] = [p for p in found["index"] if os.path.basename(p) == checkpoint]
        if not found["index"]:
            raise CheckpointFileError(f"{source} has no checkpoint {checkpoint}.index (--checkpoint)")
    kinds = (("config", CONFIG_FILE, f"{CONFIG_FILE} files"), ("vocab", VOCAB_FILE, f"{VOCAB_FILE} files"),
             ("index", "checkpoint (*.index)", "checkpoints (*.index)"))
    for key, one, several in kinds:
        paths = found[key]
        if not paths:
            raise CheckpointFileError(f"{source} has no {one}: not a released RealFormer/BERT checkpoint")
        if len(paths) > 1:
            names = sorted(os.path.relpath(p, root) for p in paths)
            hint = " (choose one with --checkpoint NAME)" if key == "index" else ""
            raise CheckpointFileError(f"{source} has several {several}: {', '.join(names)}{hint}")
    return found["config"][0], found["vocab"][0], found["index"][0]


def read_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointFileError(f"cannot read {path}: {e}") from None
    if not isinstance(raw, dict) or "vocab_size" not in raw:
        raise CheckpointFileError(f"{path} is not a BERT config (no vocab_size)")
    config = {**CONFIG_DEFAULTS, **raw}
    if config["hidden_act"] not in ACTIVATIONS:
        raise ConfigError(f"{path}: hidden_act {config['hidden_act']!r} is not one of {', '.join(ACTIVATIONS)}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ConfigError(f"{path}: hidden_size {config['hidden_size']} is not a multiple of "
                          f"num_attention_heads {config['num_attention_heads']}")
    unknown = sorted(set(raw) - set(CONFIG_DEFAULTS) - {"vocab_size"})
    if unknown:
        logger.warning("%s: ignoring keys the official BertConfig does not use: %s", path, ", ".join(unknown))
    return config


def read_vocab(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as f:
            vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointFileError(f"cannot read {path}: {e}") from None
    while vocab and vocab[-1] == "":
        vocab.pop()
    return vocab


def read_google_checkpoint(
    source: str, workdir: Optional[str] = None, checkpoint: Optional[str] = None,
    ignore: Optional[str] = None, verify: bool = True, reader: str = "builtin",
) -> GoogleCheckpoint:
    """Read a released zip, a folder (e.g. the unzipped one) or a checkpoint's ``.index``.

    ``workdir``: where a zip is extracted (required for zips). ``checkpoint``: the file
    name prefix when there are several. ``ignore``: a regex of further variable names to
    skip. ``verify``: check every tensor's CRC32C. ``reader``: ``builtin`` (NumPy only) or
    ``tensorflow`` (TensorFlow's own reader, if installed).
    """
    source = os.fspath(source)
    if os.path.isfile(source) and zipfile.is_zipfile(source):
        if workdir is None:
            raise ValueError("a workdir is needed to extract a zip")
        _extract(source, workdir)
        root = workdir
    elif os.path.isfile(source) and source.endswith(".index"):
        root, checkpoint = os.path.dirname(os.path.abspath(source)), os.path.basename(source)[: -len(".index")]
    elif os.path.isdir(source):
        root = source
    elif os.path.isfile(source):
        raise CheckpointFileError(f"{source}: not a zip file, a folder or a checkpoint's .index file")
    else:
        raise CheckpointFileError(f"{source}: no such zip, folder or .index file")
    config_path, vocab_path, prefix = _find_files(root, checkpoint, source)
    config, vocab = read_config(config_path), read_vocab(vocab_path)
    if len(vocab) != config["vocab_size"]:
        raise ConfigError(f"{vocab_path} has {len(vocab)} tokens but {config_path} says "
                          f"vocab_size {config['vocab_size']}")
    fairseq_vocabulary(vocab)  # its special tokens are checked before gigabytes of variables are read
    try:
        ignore_re = re.compile(ignore) if ignore else None
    except re.error as e:
        raise ConfigError(f"--ignore-variables {ignore!r} is not a regular expression ({e})") from None
    try:
        tf = open_checkpoint(prefix, reader)
        logger.info("checkpoint %s: %d variables", os.path.basename(prefix), len(tf.entries))
        expected = model_variables(config)
        skipped = {"optimizer slots": 0, "bookkeeping": 0, "--ignore-variables": 0}
        present = []
        for name in tf.names():
            if name.endswith(OPTIMIZER_SLOTS):
                skipped["optimizer slots"] += 1
            elif name in BOOKKEEPING or name == "_CHECKPOINTABLE_OBJECT_GRAPH":
                skipped["bookkeeping"] += 1
            elif ignore_re is not None and ignore_re.search(name):
                skipped["--ignore-variables"] += 1
            else:
                present.append(name)
        unknown = [n for n in present if n not in expected]
        if unknown:
            raise CheckpointFileError(
                f"{os.path.basename(prefix)}: unknown variables {_names(unknown)}: not a RealFormer/BERT "
                "pre-training checkpoint of this bert_config.json (skip them with --ignore-variables REGEX)"
            )
        groups = ("encoder", "pooler", "mlm", "nsp")
        kept = set(present)  # what --ignore-variables skips counts as absent: it is never read
        have = {g: [n for n, (gg, _) in expected.items() if gg == g and n in kept] for g in groups}
        need = {g: [n for n, (gg, _) in expected.items() if gg == g and n not in kept] for g in groups}
        # the encoder is required; a head is all or nothing, and the NSP classifier needs the pooler
        wanted = {"encoder": True, "mlm": bool(have["mlm"]), "nsp": bool(have["nsp"])}
        wanted["pooler"] = wanted["nsp"]
        missing = [n for g in groups if wanted[g] or have[g] for n in need[g]]
        if missing:
            raise CheckpointFileError(f"{os.path.basename(prefix)}: missing variables {_names(missing)}")
        wrong = [f"{n} {list(tf.entry(n).shape)} (expected {list(shape)})" for n, (_, shape) in expected.items()
                 if n in kept and tf.entry(n).shape != shape]
        if wrong:
            raise CheckpointFileError(
                f"{os.path.basename(prefix)}: shapes differ from {CONFIG_FILE}: {_names(wrong, 4)}")
        if have["pooler"] and not have["nsp"]:
            logger.warning("bert/pooler has no next-sentence classifier (cls/seq_relationship) beside it: "
                           "not converted")
        heads = {"mlm": wanted["mlm"], "nsp": wanted["nsp"]}
        keep = [n for n in present if wanted[expected[n][0]]]
        variables = {}
        for name in keep:
            variables[name] = tf.read(name, verify=verify)
    except TFCheckpointError as e:
        raise CheckpointFileError(str(e)) from None
    logger.info("read %d model variables; skipped %s", len(variables),
                ", ".join(f"{n} {k}" for k, n in skipped.items() if n) or "nothing")
    return GoogleCheckpoint(config, vocab, variables, skipped, heads, os.path.basename(prefix))


def _build_model(out_dir: str, flags: List[str], nsp: bool):
    """The fairseq model and config that ``fairseq-train`` would build from ``flags`` on
    the data dir ``out_dir`` (its dict.txt), task ``masked_lm``."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser(default_task="masked_lm")
    max_positions = flags[flags.index("--max-positions") + 1]
    args = options.parse_args_and_arch(parser, [out_dir, "--task", "masked_lm", "--criterion", "masked_lm",
                                                "--tokens-per-sample", max_positions, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    if nsp:
        model.register_classification_head(GOOGLE_NSP_HEAD, num_classes=2)
    return cfg, task, model


def _write(path: str, write):
    """``write(tmp_path)``, then move it into place (never a half-written file)."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def _write_text(path: str, text: str):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    _write(path, write)


def convert(source: str, out_dir: str, checkpoint: Optional[str] = None, ignore: Optional[str] = None,
            verify: bool = True, reader: str = "builtin") -> dict:
    """Convert ``source`` (zip, folder or ``.index``; see ``read_google_checkpoint``) into
    ``out_dir``; returns the summary also written to ``out_dir/conversion.json``.
    Re-running overwrites. A zip is extracted to a temporary folder (``$TMPDIR``)."""
    with tempfile.TemporaryDirectory(prefix="google_ckpt_") as workdir:
        ckpt = read_google_checkpoint(source, workdir=workdir, checkpoint=checkpoint, ignore=ignore, verify=verify,
                                      reader=reader)
    summary = write_fairseq_checkpoint(ckpt, out_dir)
    summary.update(source=os.path.basename(os.path.normpath(source)), checksums_verified=verify or reader != "builtin",
                   reader=reader)
    _write_text(os.path.join(out_dir, "conversion.json"), json.dumps(summary, indent=2) + "\n")
    return summary


def write_fairseq_checkpoint(ckpt: GoogleCheckpoint, out_dir: str) -> dict:
    """Write ``out_dir``'s files (model.pt, dict.txt, vocab.txt, bert_config.json,
    conversion.json) for a checkpoint already read; returns the summary. Empties
    ``ckpt.variables`` on the way (one copy of a large model in memory at a time)."""
    from omegaconf import OmegaConf

    from realformer_nmt.models.realformer_bert.wordpiece import is_uncased

    os.makedirs(out_dir, exist_ok=True)
    symbols, order = fairseq_vocabulary(ckpt.vocab)
    _write_text(os.path.join(out_dir, "dict.txt"), "".join(f"{s} 1\n" for s in symbols))
    _write_text(os.path.join(out_dir, VOCAB_FILE), "\n".join(ckpt.vocab) + "\n")
    _write_text(os.path.join(out_dir, CONFIG_FILE), json.dumps(ckpt.config, indent=2, sort_keys=True) + "\n")

    flags = fairseq_flags(ckpt.config)
    cfg, task, model = _build_model(out_dir, flags, ckpt.heads["nsp"])
    if len(task.source_dictionary) != len(ckpt.vocab):
        raise ConfigError(f"the fairseq dictionary has {len(task.source_dictionary)} symbols, "
                          f"the vocabulary {len(ckpt.vocab)}")
    state = model.state_dict()
    converted = fairseq_state(ckpt, order)
    n_variables = len(ckpt.variables)
    ckpt.variables.clear()
    parameters = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    fresh = sorted(parameters - set(converted))  # buffers (fairseq's "version") keep their values
    if not ckpt.heads["mlm"]:
        logger.warning("no masked-LM head (cls/predictions) in the checkpoint: the LM head is freshly "
                       "initialised (fill_mask is meaningless until it is trained)")
    extra = sorted(set(converted) - set(state))
    unexpected_fresh = [k for k in fresh if not k.startswith("encoder.lm_head.")]
    if extra or unexpected_fresh:  # a mapping bug, not a user error
        raise RuntimeError(f"conversion does not cover the model: extra {extra}, not converted {unexpected_fresh}")
    for name, value in converted.items():
        if tuple(value.shape) != tuple(state[name].shape):
            raise RuntimeError(f"{name}: converted {tuple(value.shape)}, model {tuple(state[name].shape)}")
    model.load_state_dict({**state, **converted}, strict=True, model_cfg=cfg.model)
    del state, converted

    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config["task"]["data"] = config["model"].data = "."  # the checkpoint's own folder (hub_utils resolves it)
    config["common"]["user_dir"] = None
    payload = {
        "args": None,
        "cfg": config,
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }
    _write(os.path.join(out_dir, "model.pt"), lambda p: torch.save(payload, p))

    d = task.source_dictionary
    summary = {
        "checkpoint": ckpt.name,
        "model_variables": n_variables,
        "skipped": ckpt.skipped,
        "heads": {"masked_lm": ckpt.heads["mlm"], GOOGLE_NSP_HEAD: ckpt.heads["nsp"]},
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(ckpt.vocab),
        "lowercase": is_uncased(ckpt.vocab),
        "special_tokens": {b: {"fairseq": f, "fairseq_id": d.index(f), "wordpiece_id": ckpt.vocab.index(b)}
                           for b, f in SPECIALS + (MASK,)},
        "residual_attention_mode": "mean" if ckpt.config["use_running_mean"] else "sum",
        "fairseq_flags": flags,
        "finetune_flags": finetune_arch_flags(ckpt.config),
    }
    _write_text(os.path.join(out_dir, "conversion.json"), json.dumps(summary, indent=2) + "\n")
    logger.info("wrote %s: model.pt (%d parameters), dict.txt, vocab.txt, %s, conversion.json",
                out_dir, summary["parameters"], CONFIG_FILE)
    return summary
