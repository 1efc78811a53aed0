"""The model card (``README.md``) of a Hugging Face export: the Hub's YAML header
(license, library, tags, pipeline tag), then what the model is, where it came from, how
the export was checked (the numbers ``hf_export.verify`` measured), how to load it, its
license and what to cite."""

import json

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


def _yaml(header: dict) -> str:
    lines = ["---"]
    for key, value in header.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines += [f"- {v}" for v in value]
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines + ["---", ""])


def model_card(config, summary: dict) -> str:
    """The card's text for an export described by ``config`` (``RealFormerConfig``) and
    ``summary`` (what ``export.json`` holds)."""
    google = summary["tokenizer"].startswith("BertTokenizerFast")
    head = summary["classification_head"]
    classifier = summary["heads"]["sequence_classification"] is not None
    header = {
        "license": "apache-2.0" if google else "mit",
        "library_name": "transformers",
        "tags": ["realformer", "bert", "residual-attention", "fairseq", "custom_code"],
        "pipeline_tag": "text-classification" if classifier else "fill-mask",
    }
    mode = config.residual_attention_mode
    rule = ("the running sum itself" if mode == "sum" else
            "the running sum divided by the number of layers in it (the paper's running mean)")
    diff = summary["verified"]["max_abs_diff"]
    numbers = ", ".join(f"{k} {v:.2g}" for k, v in diff.items())
    texts = (f"{summary['tokenizer_texts_checked']} texts (fixed samples with tricky whitespace and the raw "
             "valid lines of the training data) give the same ids as fairseq's `hub.encode`"
             if summary["tokenizer_texts_checked"] else
             "the WordPiece vocabulary is BERT's own `vocab.txt`, with the model's rows permuted back to it")
    auto = "AutoModelForSequenceClassification" if classifier else "AutoModelForMaskedLM"
    heads = ["masked LM (`cls.predictions`)"]
    if summary["heads"]["next_sentence"]:
        heads.append("next-sentence prediction (`cls.seq_relationship`, class 0 = B follows A)")
    if classifier:
        labels = getattr(config, "id2label", None) or {}
        heads.append(f"sequence classification from the fine-tuned head `{head}` "
                     f"({config.num_labels} output(s): {', '.join(map(str, labels.values()))})")
    labels_note = ("The heads not listed (token classification, question answering, multiple choice, and the "
                   "ones above where absent) start from fresh weights, for fine-tuning.")
    return _yaml(header) + f"""
# RealFormer (BERT with residual attention), exported from fairseq

RealFormer ([He et al., 2021](https://arxiv.org/abs/2012.11747)) is BERT with one change:
each layer adds its raw attention scores to the running sum of the earlier layers' scores
and attends with the softmax of {rule}. This model: {config.num_hidden_layers} layers, hidden
size {config.hidden_size}, {config.num_attention_heads} heads, residual attention
{"**" + mode + "**" if config.residual_attention else "**off** (plain BERT)"}, vocabulary {config.vocab_size},
inputs up to {config.max_position_embeddings - (config.position_offset if config.position_offset is not None
                                                else config.pad_token_id + 1)} tokens.

Source: the fairseq checkpoint `{summary['checkpoint']}`, exported by
realformer-nmt's `scripts/export_hf.py`. Heads with trained weights:
{"; ".join(heads)}. {labels_note}

## How it was checked

The exported folder was loaded in the Hugging Face code and compared with the fairseq
model on {summary['verified']['texts']} texts ({summary['verified']['tokens']} tokens, batched with padding):
largest absolute differences {numbers} (float32). Tokenizer: {texts}.

## How to load

Needs `torch` and `transformers` only; the model code ships in this folder
(`modeling_realformer*.py`, `configuration_realformer.py`), hence `trust_remote_code=True`:

```python
from transformers import AutoTokenizer, {auto}

tokenizer = AutoTokenizer.from_pretrained(FOLDER, trust_remote_code=True)
model = {auto}.from_pretrained(FOLDER, trust_remote_code=True).eval()
outputs = model(**tokenizer(["The film was released in 2001 ."], return_tensors="pt"))
```

Also `AutoModel`, `AutoModelForPreTraining`, `AutoModelForNextSentencePrediction`,
`AutoModelForSequenceClassification`, `AutoModelForMultipleChoice`,
`AutoModelForTokenClassification`, `AutoModelForQuestionAnswering`; `attn_implementation`
`"eager"` or `"sdpa"` (same numbers), `activation_checkpointing_enable()` (the older name
`gradient_checkpointing_enable()` too) and `resize_token_embeddings` work as for BERT.

## License

{"The weights are Google's released RealFormer checkpoint (google-research, Apache-2.0); " if google else
 "The weights were trained with realformer-nmt (MIT); the license of the training data applies to what they learned "
 "as well. "}The code files are realformer-nmt's (MIT).

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
