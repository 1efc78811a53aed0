"""The model card (``README.md``) of a Hugging Face export: the Hub's YAML header
(license, library, tags, pipeline tag, language), then what the model is, what it was
trained on and by which run (``summary["training"]``, from the checkpoint, the data dir's
``prepare.json`` or Google's ``conversion.json``), intended use, limitations, evaluation
(the run's validation metric and the numbers ``hf_export.verify`` measured), how to load it
(a snippet that runs as printed, and which auto class loads which trained weights), its
license and what to cite."""

import json
import math
from typing import List, Optional, Tuple

PAPER = """@inproceedings{he2021realformer,
  title     = {RealFormer: Transformer Likes Residual Attention},
  author    = {He, Ruining and Ravula, Anirudh and Kanagal, Bhargav and Ainslie, Joshua},
  booktitle = {Findings of the Association for Computational Linguistics: ACL-IJCNLP 2021},
  year      = {2021},
  note      = {arXiv:2012.11747}
}"""
PROJECT = """@software{realformer_nmt,
  title  = {realformer-nmt: RealFormer (residual attention) for fairseq},
  author = {{realformer-nmt contributors}},
  year   = {2026},
  note   = {version 0.1.0}
}"""
GOOGLE_README = "https://github.com/google-research/google-research/tree/master/realformer"
WIKITEXT = ("**License of the data**: WikiText ([Merity et al., 2016](https://arxiv.org/abs/1609.07843)) is "
            "English Wikipedia text under [CC BY-SA 3.0](https://creativecommons.org/licenses/by-sa/3.0/); its "
            "rare words are written `<unk>`.")


def _yaml(header: dict) -> str:
    lines = ["---"]
    for key, value in header.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines += [f"- {v}" for v in value]
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines + ["---", ""])


def _n(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def loaded_weights(kind: Optional[str], num_labels: int = 2) -> List[Tuple[str, str, List[str]]]:
    """``(auto class, what has trained weights, modules that start fresh)`` for an export
    whose classification head is ``kind`` (None, ``"next_sentence"`` or
    ``"sequence_classification"`` with ``num_labels`` outputs). Module names are those of
    the class's parameters, without the ``realformer.`` prefix of the encoder. A fine-tuned
    classifier of several outputs has the name, not the shape, of multiple choice's
    one-output ``classifier``: that class loads with ``ignore_mismatched_sizes=True``, as
    BERT's does."""
    pooler = {None: None, "next_sentence": "pooler (NSP's)",
              "sequence_classification": "pooler (the fine-tuned classifier's)"}[kind]
    mlm = "masked-LM head" + (" (pre-training's)" if kind == "sequence_classification" else "")

    def row(cls, trained, fresh):
        return cls, ", ".join(["encoder"] + [t for t in trained if t]), [f for f in fresh if f]

    fresh_pooler = None if pooler else "pooler"
    regression = kind == "sequence_classification" and num_labels == 1
    mismatched = kind == "sequence_classification" and num_labels != 1
    rows = [
        row("AutoModel", [pooler], [fresh_pooler]),
        row("AutoModelForMaskedLM", [mlm], []),
        row("AutoModelForPreTraining", [mlm, pooler, "NSP classifier" if kind == "next_sentence" else None],
            [fresh_pooler, None if kind == "next_sentence" else "cls.seq_relationship"]),
        row("AutoModelForNextSentencePrediction", [pooler, "NSP classifier" if kind == "next_sentence" else None],
            [fresh_pooler, None if kind == "next_sentence" else "cls.seq_relationship"]),
        row("AutoModelForSequenceClassification",
            [pooler, "classifier" if kind == "sequence_classification" else None],
            [fresh_pooler, None if kind == "sequence_classification" else "classifier"]),
        row("AutoModelForMultipleChoice", [pooler, "classifier (the regression head's)" if regression else None],
            [fresh_pooler, None if regression else "classifier"]),
        # same name and shape as the sequence classifier: loaded, and applied to every token
        row("AutoModelForTokenClassification", ["classifier (the sequence classifier's, on every token)"
                                                if kind == "sequence_classification" else None],
            [None if kind == "sequence_classification" else "classifier"]),
        row("AutoModelForQuestionAnswering", [], ["qa_outputs"]),
    ]
    if mismatched:
        rows = [(cls, trained + (f"; load with `ignore_mismatched_sizes=True` (the checkpoint's `classifier` has "
                                 f"{num_labels} outputs, this one 1)" if cls == "AutoModelForMultipleChoice" else ""),
                 fresh) for cls, trained, fresh in rows]
    return rows


def _corpus_lines(corpus: Optional[dict]) -> List[str]:
    """Bullets on the pre-training text, from the data dir's ``prepare.json``."""
    if not corpus:
        return ["**Text**: not described by the data dir (no `prepare.json` beside its `spm.model`: it was not "
                "made by realformer-nmt's `scripts/prepare_pretraining_data.py`)."]
    raw, words, docs = corpus["raw_files"], corpus.get("words") or {}, corpus.get("documents") or {}
    lines = []
    for split, role in (("train", "Training text"), ("valid", "Validation text")):
        if split not in raw:
            continue
        counts = ", ".join(c for c in (f"{_n(docs[split])} documents" if docs.get(split) is not None else None,
                                       f"{_n(words[split])} words" if words.get(split) is not None else None) if c)
        test_split = ("; the corpus's test split, used as training text" if split == "train"
                      and "test" in raw[split].rsplit("/", 1)[-1] else "")
        sha = (corpus.get("sha256") or {}).get(split)
        sha = f", SHA-256 `{sha[:16]}…`" if sha else ""
        name = f"{corpus['name']}, " if corpus.get("name") else ""
        lines.append(f"**{role}**: {name}`{raw[split]}` ({counts}{test_split}{sha}).")
    sp = corpus.get("sentencepiece") or {}
    trained_on = f" on `{raw['train']}`" if "train" in raw else ""
    lines.append(f"**Tokenizer**: SentencePiece ({sp.get('model_type')}, {_n(sp.get('vocab_size'))} pieces) trained"
                 f"{trained_on} by `scripts/prepare_pretraining_data.py`, with fairseq's dictionary ids.")
    return lines


def _run_line(run: dict, checkpoint: str, what: str) -> str:
    batch = (f"{_n(run['batch_size'])} sequences a batch" if run.get("batch_size")
             else f"{_n(run['max_tokens'])} tokens a batch" if run.get("max_tokens") else None)
    if batch and run.get("update_freq") not in (None, 1):
        batch += f" × update-freq {run['update_freq']}"
    settings = ", ".join(x for x in (f"lr {run['lr']}" if run.get("lr") is not None else None, batch,
                                     f"mask probability {run['mask_prob']}" if run.get("mask_prob") else None,
                                     f"samples of {run['tokens_per_sample']} tokens" if run.get("tokens_per_sample")
                                     else None, f"seed {run['seed']}" if run.get("seed") is not None else None) if x)
    epoch = f" (in epoch {run['epoch']})" if run.get("epoch") is not None else ""
    start = f", starting from `{run['restored_from']}`" if run.get("restored_from") else ""
    return (f"**{what}**: `fairseq-train --task {run['task']} --arch {run['arch']}`{start}; {settings}; "
            f"{_n(run['updates'])} updates{epoch}; this is its checkpoint `{checkpoint}`.")


def _chance(run: dict, metric: str, vocab: int, classes: Optional[int]) -> Optional[str]:
    """What guessing uniformly scores on the run's validation metric (fairseq's units)."""
    task = run.get("task")
    if metric == "loss" and task == "masked_lm":
        return f"a uniform guess over the {vocab} symbols: {math.log2(vocab):.3g} bits a masked token"
    if metric == "loss" and task == "masked_lm_nsp":
        w = run.get("nsp_loss_weight", 1.0)
        return (f"a uniform guess: {math.log2(vocab) + w:.3g} (log2 {vocab} bits a masked token"
                f"{f' + {w} × 1 bit' if w != 1 else ' + 1 bit'} a sentence pair)")
    if task == "sentence_prediction" and classes and classes > 1:
        if metric == "loss":
            return f"a uniform guess over the {classes} classes: {math.log2(classes):.3g} bits"
        if metric == "accuracy":
            return f"guessing one of the {classes} classes uniformly at random: {100 / classes:.3g} on average"
    return None


def _validation_text(run: Optional[dict], vocab: int, classes: Optional[int]) -> Optional[str]:
    val = (run or {}).get("validation")
    if not val:
        return None
    best = val.get("best")
    best = f" (the best of the run: {best})" if best is not None and best != val["value"] else ""
    unit = " (in bits: fairseq's losses are base 2)" if val["metric"] == "loss" else (
        " (percent)" if val["metric"] == "accuracy" else "")
    chance = _chance(run, val["metric"], vocab, classes)
    return (f"fairseq's validation `{val['metric']}` when this checkpoint was saved: **{val['value']}**{unit}{best}"
            f", on the data dir's valid split{f'; for comparison, {chance}' if chance else ''}.")


def model_card(config, summary: dict, name: str = "model") -> str:
    """The card's text for an export described by ``config`` (``RealFormerConfig``) and
    ``summary`` (what ``export.json`` holds); ``name``: the export's folder name, which the
    snippet loads (from the folder that holds it)."""
    google = summary["tokenizer"].startswith("BertTokenizerFast")
    head = summary["classification_head"]
    classifier = summary["heads"]["sequence_classification"] is not None
    nsp = bool(summary["heads"]["next_sentence"])
    kind = "sequence_classification" if classifier else "next_sentence" if nsp else None
    training = summary.get("training") or {}
    run, corpus = training.get("run"), training.get("corpus")
    finetune, source = training.get("finetune_data"), training.get("google")
    wikitext = bool(corpus and (corpus.get("name") or "").startswith("WikiText"))
    header = {
        "license": "apache-2.0" if google else "mit",
        "library_name": "transformers",
        "tags": ["realformer", "bert", "residual-attention", "fairseq", "custom_code"],
        "pipeline_tag": "text-classification" if classifier else "fill-mask",
    }
    if wikitext:
        header["language"] = "en"
    mode = config.residual_attention_mode
    rule = ("the running sum itself" if mode == "sum" else
            "the running sum divided by the number of layers in it (the paper's running mean)")
    max_len = config.max_position_embeddings - (config.position_offset if config.position_offset is not None
                                                else config.pad_token_id + 1)
    labels = [str(v) for v in (getattr(config, "id2label", None) or {}).values()]
    pairs = finetune and finetune.get("sentence_pairs")

    # ---- what it was trained on, and by which run
    if google:
        release = source and source.get("release")
        name_of = f"`{source['source']}`" if source and source.get("source") else f"`{summary['checkpoint']}`"
        lines = [
            f"**Source**: the TensorFlow checkpoint {name_of} in the format of Google's RealFormer release, "
            "converted to fairseq by realformer-nmt's `scripts/convert_google_checkpoint.py`"
            + (" (every tensor's stored checksum verified)" if source and source.get("checksums_verified") else "")
            + ". " + (f"Its dimensions are those of Google's **{release}** release." if release else
                      "Its dimensions match none of Google's releases (BERT-Small, -Base, -Large, -xLarge)."),
            f"**Training data and run**: [Google's README]({GOOGLE_README}) lists the released checkpoints and "
            "their sizes; it does not say what they were pre-trained on, nor for how long. The "
            "[paper](https://arxiv.org/abs/2012.11747) describes its pre-training setup. The masked-LM and "
            "next-sentence heads are the checkpoint's own.",
        ]
        if source and source.get("lowercase") is not None:
            lines.append(f"**Tokenizer**: BERT's WordPiece over the checkpoint's `vocab.txt` "
                         f"({'uncased: lower-cases its input' if source['lowercase'] else 'cased'}).")
    elif finetune:
        examples = finetune.get("examples") or {}
        counts = ", ".join(f"{_n(n)} {split}" for split, n in examples.items())
        lines = [_run_line(run, summary["checkpoint"], "Fine-tuning run")] if run else []
        lines.append(f"**Fine-tuning data**: the data dir `{finetune['data']}`: {counts} "
                     f"{'sentence pairs' if pairs else 'texts'}, labels {', '.join(f'`{x}`' for x in labels)} "
                     "(where its examples came from is not recorded in it).")
        lines += [line.replace("**Training text**", "**Pre-training text**").replace(
            "**Validation text**", "**Pre-training validation text**") for line in _corpus_lines(corpus)]
    else:
        lines = [_run_line(run, summary["checkpoint"], "Run")] if run else []
        if run and run.get("data"):
            lines.append(f"**Data dir**: `{run['data']}`.")
        lines += _corpus_lines(corpus)
    if wikitext:
        lines.append(WIKITEXT)
    training_text = "\n".join(f"- {line}" for line in lines)

    # ---- intended use and limitations
    if classifier:
        use = (f"Classifying {'sentence pairs' if pairs else 'texts'} into {', '.join(f'`{x}`' for x in labels)}, as "
               "in its fine-tuning data (`text-classification` pipeline), or a starting point for further "
               "fine-tuning.")
    else:
        use = ("A pre-trained encoder, to fine-tune for sequence or token classification, question answering "
               "or multiple choice (the classes below), and masked-token prediction (`fill-mask` pipeline); "
               "made for research on residual attention (RealFormer).")
    limits = []
    if run and finetune:
        total = (finetune.get("examples") or {}).get("train", 0)
        limits.append(f"Fine-tuned for {_n(run['updates'])} updates on {_n(total)} training examples, and "
                      f"evaluated only on its fine-tuning data's validation split; the masked-LM head is "
                      "pre-training's (fine-tuning does not train it).")
    elif run and not google:
        words = ((corpus or {}).get("words") or {}).get("train")
        over = f" over a text of {_n(words)} words" if words else ""
        limits.append(f"Pre-trained for {_n(run['updates'])} updates{over}.")
    if google:
        limits.append("What the checkpoint learned is Google's: this export reproduces it (below) and trains "
                      "nothing.")
    if wikitext:
        limits.append("English only, with Wikipedia's topics and biases; WikiText's rare words were `<unk>` in "
                      "its text, so the model has seen `<unk>` where they stood.")
    limits.append(f"Inputs up to {max_len} tokens (longer ones are a `ValueError`: truncate them)"
                  + (f"; pre-trained on samples of {run['tokens_per_sample']} tokens, so the positions past that "
                     "were never trained." if run and run.get("tokens_per_sample")
                     and run["tokens_per_sample"] < max_len else "."))
    if config.type_vocab_size == 0:
        limits.append("No token type (segment) embeddings: the tokenizer lays sentence pairs out as fairseq "
                      "does, `<s> A </s> </s> B </s>`; `token_type_ids` must be 0.")
    if not google:
        limits.append("The tokenizer gives fairseq's ids (`hub.encode`) on the texts it was checked on"
                      + (", and on `<unk>` wherever it stands except a text that is `<unk>` alone: that encodes "
                         "as `<unk>` without the word-boundary piece fairseq puts before it."
                         if summary.get("tokenizer_literal_unk") else "."))
    limits.append("`trust_remote_code=True` runs this folder's three Python files (they import only torch and "
                  "`transformers`): read them first.")

    # ---- evaluation
    diff = summary["verified"]["max_abs_diff"]
    numbers = ", ".join(f"{k} {v:.2g}" for k, v in diff.items())
    texts = (f"{summary['tokenizer_texts_checked']} texts (fixed samples with tricky whitespace and the raw "
             "valid lines of the training data) give the same ids as fairseq's `hub.encode`"
             if summary["tokenizer_texts_checked"] else
             "the WordPiece vocabulary is BERT's own `vocab.txt`, with the model's rows permuted back to it")
    evaluation = _validation_text(run, config.vocab_size, config.num_labels if classifier else None) or (
        "Not evaluated by this export (the paper reports the released checkpoints' results)." if google
        else "The checkpoint records no validation metric.")

    # ---- how to load
    auto = "AutoModelForSequenceClassification" if classifier else "AutoModelForMaskedLM"
    if classifier:
        snippet = f"""from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

path = "{name}"  # this folder (run from the folder that holds it), or its Hub repo id once uploaded
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
print(classify("A dog runs along the beach ."))  # [{{'label': ..., 'score': ...}}]"""
    else:
        snippet = f"""from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

path = "{name}"  # this folder (run from the folder that holds it), or its Hub repo id once uploaded
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
model = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True).eval()
fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
print(fill(f"The film was {{tokenizer.mask_token}} in 2001 ."))  # the 5 likeliest tokens"""
    table = "\n".join(f"| `{cls}` | {trained} | {', '.join(f'`{f}`' for f in fresh) or '—'} |"
                      for cls, trained, fresh in loaded_weights(kind, config.num_labels))
    heads = ["masked LM (`cls.predictions`)"]
    if nsp:
        heads.append("next-sentence prediction (`cls.seq_relationship`, class 0 = B follows A)")
    if classifier:
        heads.append(f"sequence classification from the fine-tuned head `{head}` "
                     f"({config.num_labels} output(s): {', '.join(labels)})")

    license_text = (
        "The weights are Google's released RealFormer checkpoint (google-research, Apache-2.0). "
        if google else
        "The weights were trained with realformer-nmt (MIT); the license of the training data applies to what "
        "they learned as well" + (" (WikiText: CC BY-SA 3.0, which asks for attribution and share-alike)" if wikitext
                                  else "") + ". ")
    bullet = "\n".join(f"- {x}" for x in limits)
    if google:
        title = (f"RealFormer {source['release']}" if source and source.get("release") else "RealFormer") + \
            " (BERT with residual attention), from a Google-format checkpoint"
    elif classifier:
        title = f"RealFormer text classifier ({', '.join(labels)}), fine-tuned with fairseq"
    else:
        title = "RealFormer (BERT with residual attention), pre-trained with fairseq" + (
            f" on {corpus['name']}" if corpus and corpus.get("name") else "")
    return _yaml(header) + f"""
# {title}

RealFormer ([He et al., 2021](https://arxiv.org/abs/2012.11747)) is BERT with one change:
each layer adds its raw attention scores to the running sum of the earlier layers' scores
and attends with the softmax of {rule}. This model: {config.num_hidden_layers} layers, hidden
size {config.hidden_size}, {config.num_attention_heads} heads, residual attention
{"**" + mode + "**" if config.residual_attention else "**off** (plain BERT)"}, vocabulary {config.vocab_size},
inputs up to {max_len} tokens. Heads with trained weights: {"; ".join(heads)}. Exported by
realformer-nmt's `scripts/export_hf.py` from the checkpoint `{summary['checkpoint']}`.

## Training data and run

{training_text}

## Intended use

{use}

## Limitations

{bullet}

## Evaluation

{evaluation}

The export itself was checked: this folder, loaded in the Hugging Face code, was compared with
the fairseq model on {summary['verified']['texts']} texts ({summary['verified']['tokens']} tokens, batched with
padding): largest absolute differences {numbers} (float32). Tokenizer: {texts}.

## How to load

Needs `torch` and `transformers` only; the model code ships in this folder
(`modeling_realformer*.py`, `configuration_realformer.py`), hence `trust_remote_code=True`:

```python
{snippet}
```

Every auto class loads the folder; the heads the checkpoint lacks start from fresh weights,
for fine-tuning (`{auto}` above has no fresh weights):

| class | trained weights | starts fresh |
|---|---|---|
{table}

`attn_implementation="eager"` or `"sdpa"` (same numbers; `model.set_attn_implementation(...)`
switches a loaded model), `activation_checkpointing_enable()` (the older name
`gradient_checkpointing_enable()` too), `resize_token_embeddings` and
`torch.onnx.export(model, ..., dynamo=True)` work as for BERT.

## License

{license_text}The code files are realformer-nmt's (MIT).

## Citation

```bibtex
{PAPER}

{PROJECT}
```

<!-- export.json -->
```json
{json.dumps(summary, indent=2)}
```
"""
