#!/usr/bin/env python
"""Post-LN vs Pre-LN vs RealFormer on a translation corpus, with one shared recipe and budget.

  # the CPU comparison in results/ (3+3 layers, d=256; seeds 1-3, two trainings at once):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --max-update 1800 --seeds 1,2,3 --jobs 2 --results results/multi30k_en_de.json
  # ... with RealFormer on Pre-LN added, the committed runs taken from the results file (only
  # realformer_preln trains; the recipe must be the file's):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --backbones postln,preln,realformer,realformer_preln --max-update 1800 --seeds 1,2,3 --jobs 2 \\
      --import-results results/multi30k_en_de.json --results results/multi30k_en_de.json

  # Pre-LN vs RealFormer on Pre-LN over ten seeds and three test sets: add the 2017 test sets to
  # the prepared data, train the ten seeds (1-5 again, not imported: the reproducibility check) ...
  python scripts/prepare_data.py --corpus multi30k --raw-dir ../shared/data/multi30k --add-test-sets
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --backbones preln,realformer_preln --max-update 1800 --seeds 6,1,7,8,9,10,2,3,4,5 --jobs 2 \\
      --results runs/compare/m30k/ten_seeds.json
  # ... and report them beside the committed file (nothing trains; finished runs are decoded on the
  # test sets they lack; the file's runs fill the seeds not finished here, in memory; its Post-LN and
  # RealFormer, seeds 1-5, are reported as it has them; a seed it holds that was trained here again
  # is checked against it):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --backbones preln,realformer_preln --max-update 1800 --seeds 1,2,3,4,5,6,7,8,9,10 --jobs 2 \\
      --report-only --import-results results/multi30k_en_de.json --results results/multi30k_en_de.json

  # value residual (ResFormer) on Pre-LN, with and without residual scores, at the ten seeds of Pre-LN and
  # RealFormer on Pre-LN (taken from the results file: only the two new backbones train), each against
  # Pre-LN, RealFormer on Pre-LN and each other on the three test sets, intervals corrected for the family:
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --backbones preln,realformer_preln,preln_vr,realformer_preln_vr --max-update 1800 \\
      --seeds 1,2,3,4,5,6,7,8,9,10 --jobs 2 --import-results results/multi30k_en_de.json \\
      --results results/multi30k_en_de.json

  # the same recipe on a second language pair (prepare_data.py --corpus multi30k --src en --tgt fr):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_fr --out runs/compare/m30k_en_fr \\
      --backbones postln,preln,realformer,realformer_preln --max-update 1800 --seeds 1,2,3 --jobs 2 \\
      --results results/multi30k_en_fr.json

  # depth stress test: 6+6 and 12+12 layers, d=128, 5 backbones (incl. RealFormer mean and on
  # Pre-LN), 2 seeds; the committed runs are taken from the results file, not trained again:
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/depth \\
      --depth-stress --seeds 1,2 --jobs 2 --import-results results/depth_stress.json \\
      --results results/depth_stress.json

  # which path matters: encoder / decoder / cross alone, all three, Post-LN (reuses the runs above):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k \\
      --path-ablation --max-update 1800 --seeds 1,2 --jobs 2 --results results/path_ablation.json

  # stability limit at 12+12: the depth-stress recipe at several learning rates, 5 backbones, 2 seeds
  # (the same --out as the depth test: its lr 1e-3 runs are reused when the recipe is identical):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/depth \\
      --stability-limit --lrs 1e-3,5e-4,2.5e-4 --depths 12 --seeds 1,2 --jobs 2 \\
      --results results/stability_depth12.json
  # ... on a fresh machine, add --import-results results/stability_depth12.json to the command
  # above: the grid's finished runs (every lr) are taken from it and only the missing ones train
  # ... and the grid from the runs finished so far (nothing trains; missing cells "not run"):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/depth \\
      --stability-limit --lrs 1e-3,5e-4,2.5e-4 --depths 12 --seeds 1,2 --report-only \\
      --results results/stability_depth12.json

  # the paper's learning-rate stability test (Fig. 3), short budget:
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/lr_sweep \\
      --lr-sweep --lrs 1e-3,3e-3,1e-2 --max-update 200 --warmup-updates 100 \\
      --validate-interval-updates 50 --log-interval 10 --jobs 2 --results results/lr_stress.json

  # the full-size recipe on a GPU (transformer_iwslt_de_en dims, fp16, about 40 epochs, 3 seeds):
  python scripts/compare_backbones.py --data data-bin/multi30k_en_de --out runs/compare/m30k_gpu \\
      --device cuda --size iwslt --lr 5e-4 --warmup-updates 1000 --dropout 0.3 --weight-decay 0.0001 \\
      --max-tokens 4096 --max-update 5280 --seeds 1,2,3 --results results/multi30k_en_de_gpu.json

  # IWSLT'14 De-En on a GPU (prepare_data.py --corpus iwslt14; tokenized BLEU, see docs/translation.md):
  python scripts/compare_backbones.py --data data-bin/iwslt14.tokenized.de-en --out runs/compare/iwslt14 \\
      --device cuda --size iwslt --lr 5e-4 --warmup-updates 4000 --dropout 0.3 --weight-decay 0.0001 \\
      --max-tokens 4096 --max-update 50000 --seeds 1,2,3 --results results/iwslt14_de_en_gpu.json

Backbones (only these flags differ between them):
  postln              fairseq's `transformer` (Post-LN)
  preln               fairseq's `transformer` --encoder-normalize-before --decoder-normalize-before
  realformer          `realformer_transformer`, residual attention on all three paths
                      (--residual-attention-mode selects sum or mean)
  realformer_mean     the same with --residual-attention-mode mean (a depth test backbone)
  realformer_preln    `realformer_transformer`, all three paths, Pre-LN
                      (--encoder-normalize-before --decoder-normalize-before); tested against
                      preln as well as postln (paired_vs_preln)
  realformer_encoder, realformer_decoder, realformer_cross
                      residual attention on that one path (the path ablation)
Everything else (dims, Adam, inverse_sqrt schedule, dropout, label smoothing, batch,
update budget, seed) is identical; dims are passed explicitly.

Each run trains in OUT/<backbone>/seed<k>/ (OUT/lr<lr>/... with --lr-sweep, OUT/L<depth>/...
with --depth-stress): checkpoints, train.log (every attempt appended), generate.txt,
train.json and result.json. The best checkpoint (by validation loss, or by validation BLEU
with --select-by-bleu) is decoded on `test` with beam search (--remove-bpe as prepare.json
names it), and on every further test split prepare.json names (Multi30k: test_2017_flickr,
test_2017_mscoco as test1, test2; result.json's bleu_by_test_set, generate_<name>.txt; the
headline `bleu` stays `test`, test_2016_flickr); a finished run that lacks a set's score is
decoded on it (only) when asked again. Scored by the corpus's BLEU convention (prepare.json's "bleu"): sacreBLEU
against the raw references (cased, 13a tokenization), or for IWSLT'14 fairseq's tokenized
BLEU as the headline with lowercased sacreBLEU of the Moses-detokenized output beside it;
the signature is stored and the JSON's recipe.scoring says which BLEU is the headline.
Every backbone is tested against Post-LN of the same seed with sacreBLEU's paired
bootstrap resampling (--bootstrap-samples, p-value per seed), on the headline's BLEU.

--jobs N trains N runs at once, each with OMP_NUM_THREADS = cores / N unless --threads is
given. How many run at once changes no result; the threads each run gets (and the CPU) change
its float rounding, so an exact rerun needs the same --threads on the same kind of CPU (each
run's train.json records its machines).

Re-running the same command resumes: finished runs are reused, an interrupted one is
restarted and fairseq continues it from checkpoint_last.pt. Asking for different settings
in the same --out is refused (one folder, one recipe).

Outputs: --results FILE.json (default OUT/comparison.json, OUT/lr_stress.json,
OUT/depth_stress.json, OUT/stability_depth<L>.json or OUT/path_ablation.json) plus FILE.md (a table), FILE.png
(validation loss against updates) and FILE_hyps/ (each run's test hypotheses). Paths inside
the repository are written relative to it.

--lr-sweep, --depth-stress and --stability-limit mark each run ok / lagging (finished, but
its best validation loss is more than --divergence-margin above the reference, one rule in
all three: the lowest best valid loss of the study's finished runs of the same seed, every
backbone, lr and depth; so a run can lag at a rate or depth where its own backbone does
best, when another backbone does far better there) / diverged (fairseq stopped on NaN/inf gradients or a collapsed fp16
loss scale). Every backbone gets its BLEU differences to Post-LN (and Pre-LN) seed by seed
(seed_paired_vs_postln / seed_paired_vs_preln).

--report-only (the main comparison and --stability-limit) trains nothing: it writes the
results of the runs finished so far, lists the missing ones in the JSON's "progress", and
marks them "not run"; the same command without it trains the missing runs. The main
comparison still decodes finished runs on the test sets they lack, and with
--import-results takes the file's runs for the seeds --out has not finished in memory
(nothing is written into --out).

With several test sets the JSON and table add, per backbone, the BLEU of every set and the
seed-paired differences per set and over the sets (per seed the mean of the sets'
differences, then mean ± sd and a 95% t interval over the seeds), and of the best valid loss.
"""

import argparse
import os
import shlex
import sys
import time

from ._common import add_device_flags, comma_list, run_command

BACKBONES = ("postln", "preln", "realformer")
VARIANTS = BACKBONES + ("realformer_mean", "realformer_preln", "realformer_encoder", "realformer_decoder",
                       "realformer_cross", "preln_vr", "realformer_preln_vr")  # = recipe.VARIANTS
DEPTH_BACKBONES = ("postln", "preln", "realformer", "realformer_mean", "realformer_preln")
DEPTH_SIZE = dict(embed_dim=128, ffn_dim=512, heads=4)  # compare.DEPTH_SIZE (kept here: --help without fairseq)
STABILITY_BACKBONES = ("postln", "realformer", "realformer_mean", "preln", "realformer_preln")  # stability.py's
STABILITY_LRS = [1e-3, 5e-4, 2.5e-4]



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("data and outputs")
    io.add_argument("--data", required=True,
                    help="binarized corpus from scripts/prepare_data.py (e.g. data-bin/multi30k_en_de)")
    io.add_argument("--references", default=None,
                    help="raw test references, one per line (default: <raw_dir>/test.de from DATA/prepare.json)")
    io.add_argument("--out", required=True, help="folder for the runs: checkpoints, logs, per-run JSON")
    io.add_argument("--results", default=None,
                    help="summary JSON path; .md and .png are written next to it "
                         "(default: OUT/comparison.json, or OUT/lr_stress.json with --lr-sweep)")
    io.add_argument("--import-results", metavar="FILE", default=None,
                    help="take the runs that FILE (a committed results JSON of the main comparison or, with "
                         "--depth-stress or --stability-limit, of that study) holds into --out instead of training "
                         "them again; refused unless FILE's recipe is the one asked for. Runs already in --out are "
                         "kept. On the same kind of CPU with the same threads fairseq's CPU training is reproducible, "
                         "so there this equals training them here (elsewhere a rerun is a slightly different run). "
                         "Main "
                         "comparison: FILE's backbones that --backbones leaves out are reported as FILE has them "
                         "(their own seeds); each run trained in --out that FILE also holds is checked against it "
                         "(the JSON's reproducibility); with --report-only FILE's runs are read, not written")
    io.add_argument("--title", default=None,
                    help="corpus name used in tables and plots (default: from DATA/prepare.json, "
                         "e.g. 'Multi30k En->De')")
    io.add_argument("--machine-note", default="",
                    help="free text stored with the machine description (e.g. 'shared with other jobs')")

    what = p.add_argument_group("what to train")
    what.add_argument("--backbones", type=comma_list(str), default=None,
                      help=f"comma list of {', '.join(VARIANTS)} (default: postln,preln,realformer; "
                           "with --depth-stress also realformer_mean and realformer_preln)")
    what.add_argument("--residual-attention-mode", choices=("sum", "mean"), default="sum",
                      help="RealFormer's rule: softmax over the running sum or mean of scores (default: sum)")
    what.add_argument("--seeds", type=comma_list(int), default=[1], help="comma list of seeds (default: 1)")

    model = p.add_argument_group("model size (identical for every backbone)")
    model.add_argument("--size", choices=("small", "iwslt", "base"), default="small",
                       help="small: 3+3 layers, 256/512/4 heads (CPU); iwslt: 6+6, 512/1024/4 "
                            "(transformer_iwslt_de_en); base: 6+6, 512/2048/8 (default: small)")
    model.add_argument("--layers", type=int, help="encoder and decoder layers (overrides --size)")
    model.add_argument("--embed-dim", type=int, help="embedding dim (overrides --size)")
    model.add_argument("--ffn-dim", type=int, help="FFN inner dim (overrides --size)")
    model.add_argument("--heads", type=int, help="attention heads (overrides --size)")

    train = p.add_argument_group("recipe and budget (identical for every backbone)")
    train.add_argument("--lr", type=float, default=1e-3,
                       help="peak learning rate, Adam + inverse_sqrt (default: %(default)s)")
    train.add_argument("--warmup-updates", type=int, default=400, help="linear warmup updates (default: %(default)s)")
    train.add_argument("--max-update", type=int, default=None,
                       help="update budget per run; deterministic, the same for every backbone; 1800 is "
                            "about 7 epochs of Multi30k at --max-tokens 2048 (default: 1800; 1200 with "
                            "--depth-stress)")
    train.add_argument("--max-minutes", type=float, default=0.0,
                       help="also stop each run after this much training time (fairseq --stop-time-hours; "
                            "0 = no limit). Backbones may then get different numbers of updates (default: 0)")
    train.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch (default: %(default)s)")
    train.add_argument("--dropout", type=float, default=0.1, help="(default: %(default)s)")
    train.add_argument("--weight-decay", type=float, default=0.0, help="(default: %(default)s)")
    train.add_argument("--label-smoothing", type=float, default=0.1, help="(default: %(default)s)")
    train.add_argument("--clip-norm", type=float, default=0.0,
                       help="gradient clipping; 0 = none, as in the paper's stability test (default: 0)")
    train.add_argument("--validate-interval-updates", type=int, default=0,
                       help="also validate every N updates (default: 0 = once per epoch)")
    train.add_argument("--select-by-bleu", action="store_true",
                       help="fairseq --eval-bleu during validation; checkpoint_best.pt is the best validation "
                            "BLEU (slower: beam search on the validation set at every validation)")
    train.add_argument("--log-interval", type=int, default=50,
                       help="fairseq's training log line every N updates (default: %(default)s)")
    train.add_argument("--beam", type=int, default=5, help="beam size for the test decode (default: %(default)s)")
    train.add_argument("--train-args", default="",
                       help="extra fairseq-train flags for every run, one shell-quoted string "
                            "(e.g. \"--update-freq 2\")")

    dev = p.add_argument_group("device")
    add_device_flags(dev)
    dev.add_argument("--bootstrap-samples", type=int, default=1000,
                     help="resamples of the paired bootstrap test against Post-LN (default: %(default)s)")

    stress = p.add_argument_group("depth stress test and path ablation")
    stress.add_argument("--depth-stress", action="store_true",
                        help="train every backbone at L+L layers for each --depths, narrow (default d=128, "
                             "FFN 512, 4 heads) instead of the comparison; runs go to OUT/L<depth>/")
    stress.add_argument("--depths", type=comma_list(int), default=None,
                        help="layer counts (encoder = decoder) of the depth test (default: 6,12); one count "
                             "with --stability-limit (default: 12)")
    stress.add_argument("--stability-limit", action="store_true",
                        help="the depth-stress recipe at every --lrs (default 1e-3,5e-4,2.5e-4) for one --depths "
                             "(default 12): a backbone x lr grid (default backbones: "
                             f"{','.join(STABILITY_BACKBONES)}); runs at --lr go to OUT/L<depth>/ (the depth "
                             "test's folders, reused when the recipe is identical), others to OUT/lr<lr>/L<depth>/")
    stress.add_argument("--path-ablation", action="store_true",
                        help="residual attention on the encoder, decoder or cross path alone, on all three, "
                             "and Post-LN; shares OUT with the main comparison (its realformer and postln runs "
                             "are reused)")

    sweep = p.add_argument_group("learning-rate stability sweep")
    sweep.add_argument("--lr-sweep", action="store_true",
                       help="train every backbone at every --lrs instead of the comparison at --lr")
    sweep.add_argument("--lrs", type=comma_list(float), default=None,
                       help="peak learning rates of the sweep (default: 1e-3,3e-3,1e-2) or of the stability grid "
                            "(default: 1e-3,5e-4,2.5e-4)")
    sweep.add_argument("--normal-lr", type=float, default=None,
                       help="the normal learning rate among --lrs, trained first and marked in the table "
                            "(default: the smallest)")
    sweep.add_argument("--divergence-margin", type=float, default=1.0,
                       help="a finished run is 'lagging' when its best valid loss is more than this above the "
                            "lowest best valid loss of the study's finished runs of the same seed (every backbone, "
                            "lr and depth of --lr-sweep, --depth-stress or --stability-limit) (default: %(default)s)")
    stress.add_argument("--cells", type=comma_list(str), default=None, metavar="LR:BACKBONE,...",
                        help="with --stability-limit: only these cells of the grid train at --seeds (e.g. "
                             "2e-3:postln,2e-3:realformer); the other cells are reported with the runs they have, "
                             "and only these count as missing (default: every cell)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write the results of the runs finished so far (the main comparison and "
                        "--stability-limit); missing runs are listed in the JSON's progress and marked 'not run'. "
                        "The main comparison still decodes finished runs on the test sets they lack")
    args = p.parse_args(argv)
    modes = [flag for flag, on in (("--lr-sweep", args.lr_sweep), ("--depth-stress", args.depth_stress),
                                   ("--stability-limit", args.stability_limit),
                                   ("--path-ablation", args.path_ablation)) if on]
    if len(modes) > 1:
        p.error(f"{' and '.join(modes)} are separate experiments: give one")
    if args.import_results and modes and modes[0] not in ("--depth-stress", "--stability-limit"):
        p.error(f"--import-results applies to the main comparison, --depth-stress and --stability-limit, "
                f"not {modes[0]}")
    if args.import_results and not os.path.isfile(args.import_results):
        p.error(f"--import-results {args.import_results}: no such file")
    if args.report_only and modes and modes != ["--stability-limit"]:
        p.error(f"--report-only applies to the main comparison and --stability-limit, not {modes[0]}")
    deep = args.depth_stress or args.stability_limit
    if args.lrs is None:
        args.lrs = list(STABILITY_LRS if args.stability_limit else [1e-3, 3e-3, 1e-2])
    if args.depths is None:
        args.depths = [12] if args.stability_limit else [6, 12]
    if args.stability_limit and len(args.depths) != 1:
        p.error("--stability-limit takes one --depths value (one grid per depth)")
    if args.path_ablation and args.backbones is not None:
        p.error("--path-ablation trains a fixed set (encoder, decoder, cross, all, postln): drop --backbones")
    if args.backbones is None:
        args.backbones = list(STABILITY_BACKBONES if args.stability_limit
                              else DEPTH_BACKBONES if args.depth_stress else BACKBONES)
    for b in args.backbones:
        if b not in VARIANTS:
            p.error(f"--backbones: unknown backbone {b!r} (choose from {', '.join(VARIANTS)})")
    if args.cells is not None:
        args.cells = _grid_cells(p, args)
    if args.max_update is None:
        args.max_update = 1200 if deep else 1800
    if deep:
        if args.layers is not None:
            p.error(f"{modes[0]} sets the layers from --depths: drop --layers")
        for name, value in DEPTH_SIZE.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    if not args.seeds:
        p.error("--seeds: give at least one seed")
    if args.no_fp16 and args.device != "cuda":
        p.error("--no-fp16 only applies to --device cuda")
    return args


def _grid_cells(p, args):
    """``--cells`` as ``{(lr, backbone)}``, each a cell of the grid (refused in one line otherwise)."""
    if not args.stability_limit:
        p.error("--cells applies to --stability-limit only")
    cells = set()
    for cell in args.cells:
        lr, _, backbone = cell.partition(":")
        try:
            value = float(lr)
        except ValueError:
            value = None
        if value is None or not backbone:
            p.error(f"--cells: {cell!r} is not LR:BACKBONE (e.g. 2e-3:postln)")
        if not any(abs(value - x) <= 1e-12 * max(abs(x), 1.0) for x in args.lrs):
            p.error(f"--cells: {cell!r}: {lr} is not one of --lrs ({','.join(f'{x:g}' for x in args.lrs)})")
        if backbone not in args.backbones:
            p.error(f"--cells: {cell!r}: {backbone} is not one of --backbones ({','.join(args.backbones)})")
        cells.add((value, backbone))
    return cells


def main(argv=None):
    args = parse_args(argv)
    return run_command("compare_backbones.py", lambda: study(args), show=print, status=1)


def study(args):
    """Train what ``args`` asks for; returns the study's Markdown table."""
    from realformer_tools.experiments import compare

    def log(message):
        print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)

    recipe = compare.Recipe(
        size=args.size, layers=args.layers, embed_dim=args.embed_dim, ffn_dim=args.ffn_dim, heads=args.heads,
        lr=args.lr, warmup_updates=args.warmup_updates, max_update=args.max_update,
        max_minutes=args.max_minutes, max_tokens=args.max_tokens, dropout=args.dropout,
        weight_decay=args.weight_decay, label_smoothing=args.label_smoothing, clip_norm=args.clip_norm,
        validate_interval_updates=args.validate_interval_updates, device=args.device,
        fp16=False if args.no_fp16 else None, select_by_bleu=args.select_by_bleu, beam=args.beam,
        log_interval=args.log_interval,
        extra=shlex.split(args.train_args))
    common = dict(seeds=args.seeds, residual_mode=args.residual_attention_mode,
                  references=args.references, results_path=args.results, machine_note=args.machine_note,
                  threads=args.threads, log=log, title=args.title, jobs=args.jobs)
    if args.import_results and (args.depth_stress or args.stability_limit):  # the main comparison imports itself
        from realformer_tools.experiments.translation.imports import import_results

        import_results(args.import_results, args.data, args.out, recipe, args.residual_attention_mode,
                       study="depth" if args.depth_stress else "stability", log=log,
                       depth=args.depths[0] if args.stability_limit else None)
    if args.lr_sweep:
        return compare.sweep_markdown(compare.lr_sweep(
            args.data, args.out, recipe, args.lrs, normal_lr=args.normal_lr, margin=args.divergence_margin,
            backbones=args.backbones, **common))
    if args.depth_stress:
        return compare.depth_markdown(compare.depth_stress(
            args.data, args.out, recipe, depths=args.depths, backbones=args.backbones,
            margin=args.divergence_margin, **common))
    if args.stability_limit:
        return compare.stability_markdown(compare.stability_limit(
            args.data, args.out, recipe, args.lrs, depth=args.depths[0], backbones=args.backbones,
            margin=args.divergence_margin, report_only=args.report_only, cells=args.cells, **common))
    if args.path_ablation:
        return compare.ablation_markdown(compare.path_ablation(
            args.data, args.out, recipe, bootstrap_samples=args.bootstrap_samples, **common))
    return compare.comparison_markdown(compare.compare(
        args.data, args.out, recipe, backbones=args.backbones, bootstrap_samples=args.bootstrap_samples,
        report_only=args.report_only, import_from=args.import_results, **common))


if __name__ == "__main__":
    sys.exit(main())
