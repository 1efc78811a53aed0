"""Export a fairseq ``realformer_bert`` checkpoint to a Hugging Face ``transformers`` folder.

``export(checkpoint, out_dir)`` writes ``config.json`` (``model_type`` "realformer",
``auto_map`` to the code files), ``model.safetensors``, the tokenizer files, the package's
``hf/`` code files (copied verbatim: torch and ``transformers`` only), a model card
(``README.md``) and ``export.json``, so that ``AutoModelForMaskedLM.from_pretrained(out_dir,
trust_remote_code=True)`` (or any class of ``AUTO_MAP``) computes what the fairseq model
computes.

* ``checkpoint``: a checkpoint file, or a folder holding ``model.pt`` (what
  ``scripts/convert_google_checkpoint.py`` writes): pre-training (``masked_lm``,
  ``masked_lm_nsp``), a converted Google checkpoint, or a ``sentence_prediction`` fine-tune.
* ``data``: the data dir of its dictionary: ``dict.txt`` (pre-training) or
  ``input0/dict.txt`` (fine-tuning, with ``label/dict.txt`` for class names); default: the
  checkpoint's folder, then the data dir recorded in the checkpoint.
* Tokenizer and vocabulary: ``hf_tokenizer.py``; configuration, weights and heads:
  ``hf_weights.py``; the model card: ``hf_model_card.py``.

Everything is checked before anything is written: a refused export leaves ``out_dir`` as
it was. The files are written to a temporary folder beside ``out_dir``, the exported
model is loaded from there and compared with fairseq's on the checked texts (the numbers go
into ``export.json`` and the card), and only then are the files moved into ``out_dir``.
"""

import json
import logging
import os
import re
import shutil
import tempfile
from typing import Callable, List, Optional

import torch

from realformer_nmt.errors import CheckpointFileError, ConfigError

from ..convert.google_mapping import MASK, SPECIALS
from .hf_model_card import model_card
from .hf_tokenizer import (  # noqa: F401  (re-exported: the export's public names)
    LITERAL_UNK_TEXT,
    SAMPLE_TEXT,
    check_tokenizer,
    google_order,
    raw_valid_text,
    read_vocab,
    sentencepiece_tokenizer,
    user_defined_pieces,
    wordpiece_tokenizer,
)
from .hf_weights import NSP_HEAD, classification_head, head_kind, hf_config_values, hf_state_dict  # noqa: F401

logger = logging.getLogger(__name__)

AUTO_MAP = {
    "AutoConfig": "configuration_realformer.RealFormerConfig",
    "AutoModel": "modeling_realformer.RealFormerModel",
    "AutoModelForMaskedLM": "modeling_realformer.RealFormerForMaskedLM",
    "AutoModelForPreTraining": "modeling_realformer.RealFormerForPreTraining",
    "AutoModelForNextSentencePrediction": "modeling_realformer.RealFormerForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_realformer.RealFormerForSequenceClassification",
    "AutoModelForMultipleChoice": "modeling_realformer.RealFormerForMultipleChoice",
    "AutoModelForTokenClassification": "modeling_realformer.RealFormerForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_realformer.RealFormerForQuestionAnswering",
}
FINETUNE_TASK = "sentence_prediction"
VERIFY_TOLERANCE = 1e-4  # float32; a larger difference is a bug in the export, not in the input


def hf_code_dir() -> str:
    from . import modeling
    return modeling.HERE


def _import_hf():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"exporting to Hugging Face needs transformers (pip install -e '.[hf]'): {e}") from None
    from .modeling import configuration_realformer, modeling_realformer
    return configuration_realformer, modeling_realformer


def _resolve(checkpoint: str):
    """``(folder, file name)`` of the checkpoint."""
    if os.path.isdir(checkpoint):
        path = os.path.join(checkpoint, "model.pt")
        if not os.path.isfile(path):
            raise CheckpointFileError(f"{checkpoint}: a folder without model.pt (give the checkpoint file itself)")
    elif os.path.isfile(checkpoint):
        path = checkpoint
    else:
        raise CheckpointFileError(f"{checkpoint}: no such file or folder")
    return os.path.dirname(os.path.abspath(path)), os.path.basename(path)


def _cfg_value(state: dict, section: str, key: str):
    cfg = state.get("cfg")
    node = cfg.get(section) if cfg is not None else None
    if node is not None:
        return node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    args = state.get("args")
    if args is None:
        return None
    return getattr(args, {"_name": "arch" if section == "model" else "task"}.get(key, key), None)


def _model_name(state: dict, path: str) -> str:
    name = _cfg_value(state, "model", "_name") or _cfg_value(state, "model", "arch")
    if name is None:
        raise CheckpointFileError(f"{path}: not a fairseq checkpoint (no model configuration)")
    return str(name)


def check_realformer_bert(path: str) -> dict:
    """The checkpoint's contents; a one-line error unless it is a ``realformer_bert`` model."""
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_MODEL_REGISTRY

    from realformer_nmt.models.realformer_bert.model import RealFormerBertModel

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # noqa: BLE001  (torch/pickle errors of every kind)
        raise CheckpointFileError(f"{path}: cannot be read as a fairseq checkpoint ({type(e).__name__}: {e})") from None
    name = _model_name(state, path)
    model_class = ARCH_MODEL_REGISTRY.get(name)
    if model_class is None or not issubclass(model_class, RealFormerBertModel):
        raise ConfigError(f"{path}: a '{name}' model, not realformer_bert; only realformer_bert checkpoints "
                          "(encoder pre-training, converted Google checkpoints, their sentence_prediction "
                          "fine-tunes) export to Hugging Face")
    return state


def _data_dir(folder: str, state: dict, data: Optional[str]) -> str:
    """The data dir the hub loads the dictionary from: ``dict.txt``, or ``input0/dict.txt``
    for a ``sentence_prediction`` fine-tune (whose task reads it there)."""
    stored = _cfg_value(state, "task", "data")
    if stored and not os.path.isabs(stored):
        stored = os.path.join(folder, stored)
    finetuned = _cfg_value(state, "task", "_name") == FINETUNE_TASK
    candidates = ([data] if data is not None else [folder]) + ([stored] if stored else [])
    need = os.path.join("input0", "dict.txt") if finetuned else "dict.txt"
    for c in candidates:
        if os.path.isfile(os.path.join(c, need)):
            return c
    if finetuned:
        raise ConfigError(f"a --task {FINETUNE_TASK} fine-tune, and no input0/dict.txt in "
                          f"{' or '.join(candidates)}: pass --data DIR, the fine-tuning data dir "
                          "(prepare_finetune_data.py --out), and --sentencepiece-model, the pre-training data's "
                          "spm.model")
    raise ConfigError(f"no dict.txt in {' or '.join(candidates)}: pass --data DIR, the data dir the model was "
                      "trained on (its dict.txt)")


def load_hub(checkpoint: str, data: Optional[str] = None):
    """``(hub, folder, data dir)``: the fairseq hub interface of a ``realformer_bert``
    checkpoint (eval mode), its folder, and the data dir of its dictionary."""
    return _load_hub(checkpoint, data)[:3]


def _load_hub(checkpoint: str, data: Optional[str] = None):
    """``load_hub``'s three, and the run that wrote the checkpoint (``training_run``)."""
    from realformer_nmt.models.realformer_bert.model import RealFormerBertModel

    folder, name = _resolve(checkpoint)
    state = check_realformer_bert(os.path.join(folder, name))
    data_dir = _data_dir(folder, state, data)
    run = training_run(state)
    del state
    hub = RealFormerBertModel.from_pretrained(folder, checkpoint_file=name, data_name_or_path=os.path.abspath(data_dir))
    return hub.eval(), folder, data_dir, run


# --------------------------------------------------------------------------------------
# where the weights came from (export.json's "training", the model card)
# --------------------------------------------------------------------------------------

# google-research/realformer's README: the released checkpoints, by (layers, heads, hidden, intermediate)
GOOGLE_RELEASES = {(4, 8, 512, 2048): "BERT-Small", (12, 12, 768, 3072): "BERT-Base",
                   (24, 16, 1024, 4096): "BERT-Large", (36, 24, 1536, 6144): "BERT-xLarge"}


def short_path(path: str) -> str:
    """A file by its folder and name (``wikitext-2/test.txt``): no path of the exporting machine."""
    return "/".join(os.path.normpath(str(path)).replace("\\", "/").split("/")[-2:])


def corpus_name(raw_files: dict) -> Optional[str]:
    """``"WikiText-2"`` / ``"WikiText-103"`` / ``"WikiText"`` when the raw files' folder or
    names say so (``wikitext-2/``, ``wiki.train.tokens``), else None."""
    names = " ".join(short_path(p).lower() for p in raw_files.values())
    found = re.search(r"wiki[-_ ]?text[-_ ]?(2|103)\b", names)
    if found:
        return f"WikiText-{found.group(1)}"
    return "WikiText" if re.search(r"wikitext|wiki\.(train|valid|test)\.tokens", names) else None


def training_run(state: dict) -> Optional[dict]:
    """The fairseq run that wrote a checkpoint: task, architecture, updates, epoch,
    optimization settings, the validation metric when it was saved, and the checkpoint it
    started from (file names only). None for a converted Google checkpoint (no run here)."""
    history = (state.get("optimizer_history") or [{}])[-1]
    if history.get("optimizer_name") == "none" and not history.get("num_updates"):
        return None  # what convert_google_checkpoint.py writes
    extra = state.get("extra_state") or {}

    def first(value):
        return value[0] if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig" else value

    metric = _cfg_value(state, "checkpoint", "best_checkpoint_metric")
    restore = _cfg_value(state, "checkpoint", "restore_file")
    data = _cfg_value(state, "task", "data")
    run = {
        "task": _cfg_value(state, "task", "_name"),
        "arch": _cfg_value(state, "model", "_name") or _cfg_value(state, "model", "arch"),
        "updates": history.get("num_updates"),
        "epoch": (extra.get("train_iterator") or {}).get("epoch"),
        "lr": first(_cfg_value(state, "optimization", "lr")),
        "batch_size": _cfg_value(state, "dataset", "batch_size"),
        "max_tokens": _cfg_value(state, "dataset", "max_tokens"),
        "update_freq": first(_cfg_value(state, "optimization", "update_freq")),
        "seed": _cfg_value(state, "common", "seed"),
        "data": os.path.basename(os.path.normpath(data)) if data else None,
        # restore_file's default resumes the run itself; any other names where it started
        "restored_from": short_path(restore) if restore and restore != "checkpoint_last.pt" else None,
        "validation": ({"metric": metric, "value": float(extra["val_loss"]),
                        "best": float(extra["best"]) if extra.get("best") is not None else None}
                       if extra.get("val_loss") is not None else None),
    }
    for section, key in (("task", "mask_prob"), ("task", "tokens_per_sample"), ("task", "num_classes"),
                         ("criterion", "nsp_loss_weight")):
        value = _cfg_value(state, section, key)
        if value is not None:
            run[key] = value
    return run


def prepared_corpus(data_dir: Optional[str]) -> Optional[dict]:
    """What ``prepare.json`` of a pre-training data dir says about its raw text (file names,
    SHA-256, documents, words, SentencePiece settings); None without one."""
    try:
        with open(os.path.join(data_dir, "prepare.json"), encoding="utf-8") as f:
            prepared = json.load(f)
        settings = prepared["settings"]
        raw = settings["raw_files"]
    except (OSError, TypeError, ValueError, KeyError):
        return None
    stats = prepared.get("documents") or {}
    return {
        "name": corpus_name(raw),
        "raw_files": {split: short_path(p) for split, p in raw.items()},
        "sha256": settings.get("sha256"),
        "documents": {split: v.get("documents") for split, v in stats.items()},
        "words": {split: v.get("words") for split, v in stats.items()},
        "sentencepiece": {"model_type": settings.get("model_type"), "vocab_size": settings.get("vocab_size")},
    }


def finetune_data(data_dir: str, hub) -> dict:
    """A ``sentence_prediction`` data dir: its name, labels and examples per split."""
    from fairseq.data import data_utils

    examples = {}
    for split in ("train", "valid", "test"):
        dataset = data_utils.load_indexed_dataset(os.path.join(data_dir, "input0", split),
                                                  hub.task.source_dictionary)
        if dataset is not None:
            examples[split] = len(dataset)
    labels = getattr(hub.task, "label_dictionary", None)
    return {"data": os.path.basename(os.path.normpath(data_dir)), "examples": examples,
            "sentence_pairs": os.path.isdir(os.path.join(data_dir, "input1")),
            "labels": [labels[i] for i in range(labels.nspecial, len(labels))] if labels is not None else None}


def google_source(folder: str, config) -> dict:
    """A converted Google checkpoint: what ``conversion.json`` says, and which of Google's
    releases has its dimensions (None: none of them)."""
    try:
        with open(os.path.join(folder, "conversion.json"), encoding="utf-8") as f:
            conversion = json.load(f)
    except (OSError, ValueError):
        conversion = {}
    dims = (config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"],
            config["intermediate_size"])
    return {"source": conversion.get("source"), "checkpoint": conversion.get("checkpoint"),
            "checksums_verified": conversion.get("checksums_verified"), "lowercase": conversion.get("lowercase"),
            "release": GOOGLE_RELEASES.get(dims)}


def _spm_model(given: Optional[str], dirs: List[str]) -> str:
    if given is not None:
        if not os.path.isfile(given):
            raise ConfigError(f"--sentencepiece-model {given}: no such file")
        return given
    dirs = list(dict.fromkeys(os.path.normpath(d) for d in dirs if d))  # each folder once, in order
    for d in dirs:
        if os.path.isfile(os.path.join(d, "spm.model")):
            return os.path.join(d, "spm.model")
    raise ConfigError(f"no spm.model in {' or '.join(dirs)}: pass --sentencepiece-model FILE "
                      "(the pre-training data's spm.model)")


def _labels(hub, kind: Optional[str], num: int) -> dict:
    """``id2label`` and ``problem_type`` of a sequence-classification head."""
    if kind != "sequence_classification":
        return {}
    if getattr(hub.task.cfg, "regression_target", False) or num == 1:
        return {"num_labels": num, "problem_type": "regression" if num == 1 else None}
    labels = getattr(hub.task, "label_dictionary", None)
    names = ([labels[i + labels.nspecial] for i in range(num)] if labels is not None
             and len(labels) >= num + labels.nspecial else [f"LABEL_{i}" for i in range(num)])
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)},
            "problem_type": "single_label_classification"}


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------


def verify(folder: str, modeling, model, tokenizer, head: Optional[str], kind: Optional[str], order: List[int],
           texts: List[str]) -> dict:
    """Largest absolute differences between fairseq's ``model`` and the folder loaded in the
    Hugging Face code, on up to 16 of ``texts`` encoded by the exported tokenizer (batched,
    padded; every non-padded position of the sequence output and the masked-LM logits)."""
    from transformers.utils import logging as hf_logging

    texts = [t for t in texts if t.strip()][:16]
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the load reports of heads that start fresh, by design
    hf_logging.disable_progress_bar()
    try:
        diff = _differences(folder, modeling, model, head, kind, order, ids, mask)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    result = {"texts": len(texts), "tokens": int(mask.sum()),
              "max_abs_diff": {k: float(f"{v.abs().max().item():.3g}") for k, v in diff.items()}}
    worst = max(result["max_abs_diff"].values())
    if worst > VERIFY_TOLERANCE:  # a bug in the export, not in its input
        raise RuntimeError(f"the exported model differs from fairseq's by {worst:.3g}: {result['max_abs_diff']}")
    return result


def _differences(folder, modeling, model, head, kind, order, ids, mask) -> dict:
    tokens = torch.tensor(order)[ids]  # Hugging Face id i is fairseq id order[i]
    keep = mask.bool()
    mlm_model = modeling.RealFormerForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
        logits, _ = model(tokens)
        diff = {"sequence_output": mlm_model.realformer(ids, mask).last_hidden_state[keep] - features[keep],
                "masked_lm_logits": mlm_model(ids, mask).logits[keep] - logits[keep][:, order]}
        if kind == "next_sentence":
            got = modeling.RealFormerForPreTraining.from_pretrained(folder).eval()(ids, mask).seq_relationship_logits
            diff[head] = got - model.classification_heads[head](features).flip(-1)
        elif kind == "sequence_classification":
            got = modeling.RealFormerForSequenceClassification.from_pretrained(folder).eval()(ids, mask).logits
            diff[head] = got - model.classification_heads[head](features)
    return diff


def export(checkpoint: str, out_dir: str, data: Optional[str] = None, sentencepiece_model: Optional[str] = None,
           head: Optional[str] = None, log: Callable[[str], None] = logger.info) -> dict:
    """Write the Hugging Face folder ``out_dir``; returns a summary (also ``export.json``)."""
    from safetensors.torch import save_file

    configuration, modeling = _import_hf()
    hub, folder, data_dir, run = _load_hub(checkpoint, data)
    log(f"[1/5] loaded {checkpoint} (dictionary: {data_dir})")
    model, dictionary = hub.model, hub.task.source_dictionary
    values = hf_config_values(model)
    max_length = values["max_position_embeddings"] - (
        0 if values["position_offset"] is not None else dictionary.pad() + 1)
    head = classification_head(model, head)
    kind = head_kind(model, head)

    log("[2/5] tokenizer")
    vocab_file = os.path.join(folder, "vocab.txt")
    google = os.path.isfile(vocab_file)
    staging = None
    try:
        if google:
            vocab = read_vocab(vocab_file)
            order = google_order(vocab, dictionary)
            ids = {f: vocab.index(b) for b, f in dict(SPECIALS + (MASK,)).items()}
            tokenizer = wordpiece_tokenizer(vocab, max_length)
            tokenizer_kind, texts, checked, literal_unk = "BertTokenizerFast (vocab.txt)", [], 0, False
        else:
            order = list(range(len(dictionary)))
            ids = {s: dictionary.index(s) for s in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")}
            spm_model = _spm_model(sentencepiece_model, [data_dir, data, folder])
            tokenizer = sentencepiece_tokenizer(spm_model, dictionary, values["type_vocab_size"] > 0, max_length)
            from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

            hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=spm_model))
            literal_unk = "<unk>" in user_defined_pieces(spm_model)
            texts = (SAMPLE_TEXT + (LITERAL_UNK_TEXT if literal_unk else [])
                     + raw_valid_text(os.path.dirname(os.path.abspath(spm_model))))
            checked = check_tokenizer(tokenizer, hub, texts)
            tokenizer_kind = f"PreTrainedTokenizerFast ({os.path.basename(spm_model)}, fairseq dictionary ids)"
            log(f"  {checked} texts encode as fairseq's hub.encode encodes them")
        training = {
            "run": run,
            # the pre-training text: prepare.json beside the SentencePiece model (a fine-tune's too)
            "corpus": None if google else prepared_corpus(os.path.dirname(os.path.abspath(spm_model))),
            "finetune_data": finetune_data(data_dir, hub) if run and run["task"] == FINETUNE_TASK else None,
            "google": google_source(folder, values) if google else None,
        }

        num = model.classification_heads[head].out_proj.out_features if head else 2
        config = configuration.RealFormerConfig(
            vocab_size=len(order), pad_token_id=ids["<pad>"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
            architectures=["RealFormerForSequenceClassification" if kind == "sequence_classification"
                           else "RealFormerForPreTraining"],
            auto_map=dict(AUTO_MAP), classification_head=head, **_labels(hub, kind, num), **values,
            # a fine-tune's classifier keeps the dropout it was trained with (fairseq's --pooler-dropout)
            classifier_dropout=(float(getattr(model.args, "pooler_dropout", 0.0))
                                if kind == "sequence_classification" else None))
        state = hf_state_dict(model, order, head)
        log(f"[3/5] mapped {sum(p.numel() for p in model.parameters())} parameters (residual attention: "
            f"{config.residual_attention_mode if config.residual_attention else 'off'}; "
            f"classification head: {head or 'none'})")

        parent = os.path.dirname(os.path.abspath(out_dir))
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", dir=parent)
        config.save_pretrained(staging)
        save_file(state, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        if google:  # BERT's own vocab.txt beside tokenizer.json, as BERT folders have it
            with open(os.path.join(staging, "vocab.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(vocab) + "\n")
        for name in modeling_files():
            shutil.copyfile(os.path.join(hf_code_dir(), name), os.path.join(staging, name))
        log("[4/5] verifying the folder against fairseq")
        verified = verify(staging, modeling, model, tokenizer, head, kind, order, texts or SAMPLE_TEXT)
        summary = {
            "checkpoint": os.path.basename(os.path.join(folder, _resolve(checkpoint)[1])),
            "model_type": "realformer",
            "residual_attention_mode": config.residual_attention_mode,
            "residual_attention": config.residual_attention,
            "vocab_size": config.vocab_size,
            "tokenizer": tokenizer_kind,
            "tokenizer_texts_checked": checked,
            "tokenizer_literal_unk": literal_unk,  # "<unk>" is a SentencePiece piece (WikiText's) and the unknown token
            "heads": {"masked_lm": True, NSP_HEAD: kind == "next_sentence",
                      "sequence_classification": head if kind == "sequence_classification" else None},
            "classification_head": head,
            "verified": verified,
            "classes": sorted(AUTO_MAP),
            "training": training,
        }
        with open(os.path.join(staging, "export.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(summary, indent=2) + "\n")
        with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
            f.write(model_card(config, summary, name=os.path.basename(os.path.normpath(os.path.abspath(out_dir)))))
        log(f"[5/5] writing {out_dir}")
        os.makedirs(out_dir, exist_ok=True)
        umask = os.umask(0)
        os.umask(umask)
        for name in sorted(os.listdir(staging)):
            os.chmod(os.path.join(staging, name), 0o666 & ~umask)  # not the temporary folder's 0600
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return {**summary, "out": out_dir}


def modeling_files():
    from .modeling import FILES
    return FILES
