#!/usr/bin/env python
"""Train speed and memory of realformer_transformer against fairseq's transformer, same run.

Variants: vanilla (fairseq's transformer) and RealFormer (all three paths, sum) with each
kernel; same weights, same batch, interleaved round by round. One row per size, tokens per
batch, length T and dtype: train tokens/s as the median of the per-round ratios to vanilla
(with their range), each step timed with CUDA events on CUDA; the GPU's busy share of one step
per variant (a row below 80% is host-bound and said not to rank kernels); peak memory (CUDA:
max_memory_allocated of a step; CPU: a fresh process per variant) and bytes saved for backward;
with --decode-alternations, beam-search sentences/s. Prints a Markdown table; --json is written
after every row, and a second call with the same settings keeps the rows it has.

Defaults on CUDA: sizes base,big; 8192 and 32768 tokens per batch; T = 128,512; float16 and
bfloat16; 15 rounds (a host-bound row needs them). On CPU: iwslt,base; 4096 tokens; T =
32,128,512; float32; 5 rounds; decoding measured.

  python scripts/benchmark_speed.py --json results/speed_cpu.json --markdown results/speed_cpu.md
  python scripts/benchmark_speed.py --device cuda --json results/gpu/speed.json --markdown results/gpu/speed.md
  python scripts/benchmark_speed.py --device cuda --sizes big --tokens 16384 --lengths 128 --dtypes float16
"""

import argparse
import json
import os
import platform
import sys
import time

from ._common import comma_list, exit_zero, fail

SIZE_NAMES = ("iwslt", "base", "big", "toy")
DTYPES = ("float32", "float16", "bfloat16")
CUDA_DEFAULTS = dict(sizes=["base", "big"], tokens=[8192, 32768], lengths=[128, 512], dtypes=["float16", "bfloat16"],
                     alternations=15, decode_alternations=0)
CPU_DEFAULTS = dict(sizes=["iwslt", "base"], tokens=[4096], lengths=[32, 128, 512], dtypes=["float32"],
                    alternations=5, decode_alternations=None)
# what a second call must share with the JSON's rows for them to be kept
SETTINGS = ("variants", "mode", "warmup", "alternations", "vocab", "beam", "decode_sentences", "decode_len",
            "decode_alternations", "memory", "device", "padded")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=comma_list(str, SIZE_NAMES), default=None,
                   help="model sizes: iwslt (transformer_iwslt_de_en dims), base (transformer), big "
                        "(transformer_wmt_en_de_big, attention dropout 0.1), toy (2+2 layers, d=32)")
    p.add_argument("--tokens", type=comma_list(int), default=None,
                   help="target tokens per training batch, a comma list: tokens // T sentences each")
    p.add_argument("--lengths", type=comma_list(int), default=None, help="source = target length T, a comma list")
    p.add_argument("--dtypes", "--dtype", type=comma_list(str, DTYPES), default=None, dest="dtypes",
                   help="comma list of float32, float16, bfloat16")
    p.add_argument("--variants", type=comma_list(str), default=None,
                   help="vanilla and kernel names (default: vanilla and every kernel but auto; on CPU not triton, "
                        "which runs there only in Triton's interpreter)")
    p.add_argument("--mode", choices=["sum", "mean"], default="sum", help="RealFormer mode (default: %(default)s)")
    p.add_argument("--alternations", type=int, default=None, help="timed rounds per variant (default: 15 CUDA, 5 CPU)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    p.add_argument("--decode-alternations", type=int, default=None,
                   help="timed beam searches per variant, 0 for none (default: 0 on CUDA, --alternations on CPU)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: %(default)s)")
    p.add_argument("--decode-sentences", type=int, default=8, help="sentences per beam search (default: %(default)s)")
    p.add_argument("--decode-len", type=int, default=None, help="tokens generated per sentence (default: min(T, 64))")
    p.add_argument("--first-pass", type=int, default=0, metavar="N",
                   help="also time one train step at each of N new lengths per variant (the cost of compiling "
                        "for new shapes), first size and smallest --tokens, first dtype (default: 0, none)")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default: %(default)s)")
    p.add_argument("--no-memory", action="store_true", help="skip peak memory (on CPU: a process per variant)")
    p.add_argument("--padded", action="store_true",
                   help="padded batches: sentence lengths from T/2 to T, sources left-padded, targets right-padded "
                        "(as fairseq collates them; default: every sentence T tokens)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="start no row after this many seconds (the rows left are listed as not run)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--json", help="write the results here (after every row; rows already there are kept)")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args(argv)
    if args.variants is not None and "vanilla" not in args.variants:
        p.error("--variants must include vanilla (ratios are to vanilla)")
    if (args.alternations is not None and args.alternations < 1) or (args.decode_alternations or 0) < 0:
        p.error("--alternations must be at least 1 and --decode-alternations at least 0")
    return args


def first_pass_lengths(n):
    """``n`` lengths from 101 up in steps of 6, none a multiple of 8: a new shape each."""
    return [101 + 6 * i for i in range(n)]


def main(argv=None):
    args = parse_args(argv)
    import torch

    import realformer_nmt  # noqa: F401  (registers the archs)
    from realformer_tools.experiments import benchmark

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for key, value in (CUDA_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.decode_alternations is None:
        args.decode_alternations = args.alternations
    variants = args.variants or ["vanilla"] + [k for k in benchmark.VARIANTS if k not in ("vanilla", "auto")
                                               and (device.startswith("cuda") or k != "triton")]
    unknown = [v for v in variants if v not in benchmark.VARIANTS]
    if unknown:
        sys.exit(fail("benchmark_speed.py", f"--variants: unknown {', '.join(unknown)} "
                      f"(choose from {', '.join(benchmark.VARIANTS)})"))
    settings = dict(variants=variants, device=device, memory=not args.no_memory,
                    **{k: getattr(args, k) for k in SETTINGS if k not in ("variants", "device", "memory")})
    before = None
    if args.json and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            before = json.load(f)
    kept = before["configs"] if before and before.get("settings") == settings else []
    start = time.time()
    results = dict(
        command="python scripts/benchmark_speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
        settings=settings, device=device, gpu=torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        mode=args.mode, torch=torch.__version__, threads=torch.get_num_threads(),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        gpu_bound=benchmark.GPU_BOUND, configs=list(kept), not_run=[],
        first_pass=list(before.get("first_pass", [])) if kept else [])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

    def save(config=None):
        if config is not None:
            results["configs"].append(config)
        results["seconds"] = round(time.time() - start, 1)
        benchmark.write(results, args.json)

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if kept:
        log(f"kept {len(kept)} rows from {args.json} (same settings)")
    common = dict(alternations=args.alternations, warmup=args.warmup, beam=args.beam,
                  decode_sentences=args.decode_sentences, decode_len=args.decode_len,
                  decode_alternations=args.decode_alternations, vocab=args.vocab, mode=args.mode, device=device,
                  memory=not args.no_memory, padded=args.padded)
    ran = benchmark.run_benchmark(
        args.sizes, args.tokens, args.lengths, [getattr(torch, d) for d in args.dtypes], variants,
        deadline=None if args.deadline is None else start + args.deadline,
        done={benchmark.row_key(c) for c in kept}, on_row=save, log=log, **common)
    results["not_run"] = ran["not_run"]
    if args.first_pass and not results["first_pass"]:
        if args.deadline is not None and time.time() > start + args.deadline:
            results["not_run"].append(["first pass", args.first_pass])
        else:
            results["first_pass"].append(benchmark.first_pass(
                args.sizes[0], variants, first_pass_lengths(args.first_pass), tokens=min(args.tokens),
                vocab=args.vocab, mode=args.mode, device=device, dtype=getattr(torch, args.dtypes[0]), log=log))
    save()
    print(benchmark.markdown_table(results))
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        benchmark.write(results, None, args.markdown)
    return results


command = exit_zero(main)


if __name__ == "__main__":
    main()
