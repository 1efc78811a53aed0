#!/usr/bin/env python
"""Attention entropy and adjacent-layer JSD per layer and head, with the paper's violin
plots (He et al. 2021, Figs 4-8), for a translation or encoder-only checkpoint.

Beside the attention each layer uses, the same statistics of each layer's own scores
softmax(mask(Q_n K_n^T / sqrt(d))) are measured: the control that separates what a
RealFormer layer learns from what its running sum A_n = A_{n-1} + Q_n K_n^T / sqrt(d)
contains by construction (for Post-LN, Pre-LN and a path's first layer, own = used).

Writes into --out: attention_stats.json (and attention_stats_compare.json with
--compare; the own-score statistics under "own_scores"), <type>_entropy.png and
<type>_jsd.png for each attention type present (encoder_self, decoder_self, cross; both
models side by side with --compare) and <type>_{entropy,jsd}_own_scores.png for the own
scores, summary.md (per-layer medians of both, also printed) and run.json (details). Re-running the
same command resumes an interrupted analysis or reuses a finished one (--force redoes it).

Example (Post-LN on the left, RealFormer on the right, as in the paper):
  python scripts/analyze_attention.py --path runs/compare/m30k/postln/seed1/checkpoint_best.pt \\
      --compare runs/compare/m30k/realformer/seed1/checkpoint_best.pt \\
      --data data-bin/multi30k_en_de --out results/attention_multi30k
"""

import argparse
import logging
import os
import sys

import torch

import realformer_nmt  # noqa: F401  (registers the models)
from realformer_nmt.errors import ConfigError
from realformer_tools.experiments.attention_analysis import analyze_and_report

from ._common import exit_zero, install_fairseq_fixes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="checkpoint to analyse (realformer_transformer*, transformer, "
                   "realformer_bert*, roberta*)")
    p.add_argument("--data", required=True,
                   help="fairseq data-bin the checkpoint's task reads (translation or masked_lm)")
    p.add_argument("--subset", default="test", help="split to analyse (default: test)")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="analyse only the first N items of the split (default: all)")
    p.add_argument("--compare", help="a second checkpoint (e.g. Post-LN), drawn beside the first")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--label", help="name of the --path model in plots and tables (default: arch and settings)")
    p.add_argument("--compare-label", help="name of the --compare model")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per forward pass (default: 8192)")
    p.add_argument("--mlm-input", choices=("original", "masked"), default="original",
                   help="encoder-only models on a masked-LM data dir: analyse the original text (default) "
                        "or the input as the task masks it")
    p.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    p.add_argument("--force", action="store_true", help="start over instead of resuming from --out")
    args = p.parse_args(argv)
    install_fairseq_fixes()  # safe checkpoint loading
    logging.getLogger().setLevel(os.environ.get("LOGLEVEL", "INFO").upper())  # as fairseq's CLIs
    logging.getLogger("matplotlib").setLevel(logging.WARNING)

    for flag, value in (("--max-sentences", args.max_sentences), ("--batch-size", args.batch_size),
                        ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}: must be a positive number, got {value}")
    if args.compare and os.path.abspath(args.compare) == os.path.abspath(args.path):
        raise ConfigError("--compare: same checkpoint as --path")
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    result = analyze_and_report(
        args.path, args.data, args.out, compare=args.compare, subset=args.subset,
        max_sentences=args.max_sentences, batch_size=args.batch_size, max_tokens=args.max_tokens,
        device=device, mlm_input=args.mlm_input, labels=(args.label, args.compare_label),
        force=args.force, log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(result["markdown"])
    print(f"wrote {', '.join(os.path.basename(f) for f in result['json'] + result['png'])}, "
          f"summary.md, run.json in {args.out}", file=sys.stderr)
    return result


command = exit_zero(main)


if __name__ == "__main__":
    main()
