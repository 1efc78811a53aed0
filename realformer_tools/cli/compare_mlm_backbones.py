#!/usr/bin/env python
"""Post-LN vs Pre-LN vs RealFormer BERT-style encoders on a masked-LM corpus, one recipe.

The sibling of compare_backbones.py (same machinery: resumable fairseq-train runs, their
logs parsed into curves) for encoder pre-training:

  postln      fairseq's roberta (Post-LN)
  preln       roberta + --encoder-normalize-before
  realformer  realformer_bert (Post-LN, residual attention, --residual-attention-mode)

Identical dims, optimizer, schedule, batch, update budget and seeds. Every run validates
on a fixed subset of the validation set every --validate-interval-updates updates (MLM
accuracy curve); its best checkpoint is then evaluated on the whole validation set with
fairseq-validate. Writes --results (JSON) with .md and .png beside it. Re-running the
same command reuses finished runs and resumes an interrupted one.

  python scripts/prepare_pretraining_data.py --raw-dir ../shared/data/wikitext-2 --out data-bin/wikitext2_mlm \\
      --no-full-vocabulary   # the committed results' dictionary (the train text's pieces only)
  python scripts/compare_mlm_backbones.py --data data-bin/wikitext2_mlm --out runs/compare/mlm \\
      --max-update 600 --warmup-updates 60 --seeds 1,2,3 --jobs 2 --results results/mlm_wikitext2.json
"""

import argparse
import shlex
import sys

from ._common import add_device_flags, comma_list, run_command

BACKBONES = ("postln", "preln", "realformer")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="masked-LM data dir (scripts/prepare_pretraining_data.py --out)")
    p.add_argument("--out", required=True, help="folder for the runs (checkpoints, logs, result.json per run)")
    p.add_argument("--results", help="JSON summary path; .md and .png go beside it (default: OUT/mlm_comparison.json)")
    p.add_argument("--backbones", type=comma_list(str, BACKBONES), default=list(BACKBONES),
                   help="comma list of postln, preln, realformer (default: all)")
    p.add_argument("--seeds", type=comma_list(int), default=[1], help="comma list of seeds (default: 1)")
    p.add_argument("--residual-attention-mode", choices=["sum", "mean"], default="sum",
                   help="realformer's mode (default: %(default)s)")
    p.add_argument("--objective", choices=["mlm", "mlm_nsp"], default="mlm",
                   help="mlm: --task masked_lm --criterion masked_lm_acc; mlm_nsp: BERT's MLM + next-sentence "
                        "prediction (--task/--criterion masked_lm_nsp) (default: %(default)s)")
    p.add_argument("--layers", type=int, default=4, help="encoder layers (default: %(default)s)")
    p.add_argument("--embed-dim", type=int, default=256, help="hidden size (default: %(default)s)")
    p.add_argument("--ffn-dim", type=int, default=1024, help="intermediate size (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default: %(default)s)")
    p.add_argument("--tokens-per-sample", type=int, default=128, help="block length (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="blocks per update (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup-updates", type=int, default=50, help="linear warmup (default: %(default)s)")
    p.add_argument("--max-update", type=int, default=500, help="update budget, every backbone (default: %(default)s)")
    p.add_argument("--validate-interval-updates", type=int, default=50,
                   help="validate every N updates (default: %(default)s)")
    p.add_argument("--max-valid-steps", type=int, default=20,
                   help="validation batches per evaluation during training: a fixed subset (default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.1, help="(default: %(default)s)")
    p.add_argument("--attention-dropout", type=float, default=0.1, help="(default: %(default)s)")
    p.add_argument("--train-args", default="", help="extra fairseq-train flags for every backbone alike (one string)")
    add_device_flags(p)
    p.add_argument("--machine-note", default="", help="a note stored with the machine description")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    def study():
        from realformer_tools.experiments import mlm_compare

        recipe = mlm_compare.MLMRecipe(
            objective=args.objective, layers=args.layers, embed_dim=args.embed_dim, ffn_dim=args.ffn_dim,
            heads=args.heads, tokens_per_sample=args.tokens_per_sample, batch_size=args.batch_size, lr=args.lr,
            warmup_updates=args.warmup_updates, max_update=args.max_update,
            validate_interval_updates=args.validate_interval_updates, max_valid_steps=args.max_valid_steps,
            dropout=args.dropout, attention_dropout=args.attention_dropout, device=args.device,
            fp16=False if args.no_fp16 else None, extra=shlex.split(args.train_args),
        )
        return mlm_compare.comparison_markdown(mlm_compare.compare(
            args.data, args.out, recipe, backbones=args.backbones, seeds=args.seeds,
            residual_mode=args.residual_attention_mode, results_path=args.results,
            machine_note=args.machine_note, threads=args.threads, log=lambda m: print(m, flush=True),
            jobs=args.jobs,
        ))

    return run_command("compare_mlm_backbones.py", study, show=print)


if __name__ == "__main__":
    sys.exit(main())
