#!/usr/bin/env python
"""Export a fairseq realformer_bert checkpoint to a Hugging Face transformers folder.

  python scripts/export_hf.py checkpoints/realformer_bert_small --out hf/realformer_bert_small

CHECKPOINT: a checkpoint file (fairseq-train's checkpoint_*.pt) or a folder holding model.pt
(what scripts/convert_google_checkpoint.py writes). --out receives config.json
(model_type "realformer", auto_map), model.safetensors, the tokenizer files, the
model code (configuration_realformer.py, modeling_realformer*.py: torch + transformers
only), a model card README.md and export.json (also printed); then, with nothing but
transformers installed:

  from transformers import AutoModelForMaskedLM, AutoTokenizer
  model = AutoModelForMaskedLM.from_pretrained(OUT, trust_remote_code=True)
  tokenizer = AutoTokenizer.from_pretrained(OUT, trust_remote_code=True)

A --task sentence_prediction fine-tune exports its head for
AutoModelForSequenceClassification:

  python scripts/export_hf.py checkpoints/ft/checkpoint_best.pt --out hf/ft \
      --data data-bin/captions --sentencepiece-model data-bin/wikitext2_mlm/spm.model

Everything is checked first: a refused export writes nothing. Needs transformers:
pip install -e '.[hf]'. Re-running overwrites OUT's files.
"""

import argparse
import sys

from ._common import input_output_error, run_command


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint file, or a folder holding model.pt")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--data", metavar="DIR",
                   help="the data dir whose dictionary the model uses: dict.txt, or input0/dict.txt for a "
                        "--task sentence_prediction fine-tune (default: the checkpoint's folder, then the data "
                        "dir recorded in the checkpoint)")
    p.add_argument("--sentencepiece-model", metavar="FILE",
                   help="SentencePiece model of a model pre-trained here (default: DATA/spm.model; for a "
                        "fine-tune, the pre-training data's spm.model)")
    p.add_argument("--head", metavar="NAME",
                   help="the classification head to export, when the checkpoint has several (default: its only "
                        "one: next_sentence -> the NSP head, any other -> AutoModelForSequenceClassification)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    def export():
        from realformer_tools.hf import hf_export

        return hf_export.export(args.checkpoint, args.out, data=args.data,
                                sentencepiece_model=args.sentencepiece_model, head=args.head,
                                log=lambda m: print(m, file=sys.stderr, flush=True))

    return run_command("export_hf.py", export, problem=input_output_error(args.checkpoint, args.out))


if __name__ == "__main__":
    sys.exit(main())
