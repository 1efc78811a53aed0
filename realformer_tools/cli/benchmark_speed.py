#!/usr/bin/env python
"""Speed and memory of realformer_transformer against fairseq's transformer, same run.

Variants: vanilla (fairseq's transformer), and RealFormer (all three paths, sum) with
every kernel (materialized, fused, bias, ..., auto); same weights, same batches,
interleaved step by step. For every size (iwslt, base, big; toy for smoke runs) and
length T: training tokens/s (forward + backward + Adam), peak memory (CPU: fresh
process per variant; CUDA: torch.cuda.max_memory_allocated of a step), bytes saved for
backward, and beam-search sentences/s, each with its ratio to vanilla. Prints a
Markdown table; --json / --markdown write the results.

  python scripts/benchmark_speed.py --json results/speed_cpu.json --markdown results/speed_cpu.md
  python scripts/benchmark_speed.py --device cuda --dtype float16 --sizes base,big --lengths 128,512,1024 \
      --json results/gpu/speed_float16.json --markdown results/gpu/speed_float16.md
"""

import argparse
import os
import platform
import sys
import time

from ._common import comma_list, exit_zero

SIZE_NAMES = ("iwslt", "base", "big", "toy")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=comma_list(str, SIZE_NAMES), default=["iwslt", "base"],
                   help="model sizes: iwslt (transformer_iwslt_de_en dims), base (transformer), big "
                        "(transformer_wmt_en_de_big), toy (2+2 layers, d=32) (default: iwslt,base)")
    p.add_argument("--lengths", type=comma_list(int), default=[32, 128, 512],
                   help="source = target length T (default: 32,128,512)")
    p.add_argument("--variants", type=comma_list(str), default=None,
                   help="vanilla and kernel names (default: vanilla and every kernel)")
    p.add_argument("--mode", choices=["sum", "mean"], default="sum", help="RealFormer mode (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=4096,
                   help="target tokens per training batch: tokens // T sentences (default: %(default)s)")
    p.add_argument("--alternations", type=int, default=5,
                   help="timed rounds per variant, medians reported (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    p.add_argument("--decode-alternations", type=int, default=None,
                   help="timed beam searches per variant (default: --alternations)")
    p.add_argument("--beam", type=int, default=4, help="beam size (default: %(default)s)")
    p.add_argument("--decode-sentences", type=int, default=8, help="sentences per beam search (default: %(default)s)")
    p.add_argument("--decode-len", type=int, default=None,
                   help="tokens generated per sentence (default: min(T, 64))")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default: %(default)s)")
    p.add_argument("--no-memory", action="store_true", help="skip the per-variant peak-memory processes")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args(argv)
    if args.variants is not None and "vanilla" not in args.variants:
        p.error("--variants must include vanilla (ratios are to vanilla)")
    if args.alternations < 1 or (args.decode_alternations is not None and args.decode_alternations < 1):
        p.error("--alternations and --decode-alternations must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    import realformer_nmt  # noqa: F401  (registers the archs)
    from realformer_tools.experiments import benchmark

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    variants = args.variants or list(benchmark.VARIANTS)
    unknown = [v for v in variants if v not in benchmark.VARIANTS]
    if unknown:
        print(f"benchmark_speed.py: error: --variants: unknown {', '.join(unknown)} "
              f"(choose from {', '.join(benchmark.VARIANTS)})", file=sys.stderr)
        sys.exit(2)
    start = time.time()
    results = {"configs": []}
    for size in args.sizes:
        for length in args.lengths:
            print(f"{size} T={length}", file=sys.stderr, flush=True)
            results["configs"].append(benchmark.run_config(
                size, length, variants, tokens=args.tokens, alternations=args.alternations,
                decode_alternations=args.decode_alternations,
                warmup=args.warmup, beam=args.beam, decode_sentences=args.decode_sentences,
                decode_len=args.decode_len or min(length, 64), vocab=args.vocab, mode=args.mode,
                device=device, dtype=getattr(torch, args.dtype), memory=not args.no_memory,
                log=lambda m: print(m, file=sys.stderr, flush=True),
            ))
    results.update(
        command="python scripts/benchmark_speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
        device=device, gpu=torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        dtype=args.dtype, mode=args.mode, torch=torch.__version__,
        threads=torch.get_num_threads(), machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        seconds=round(time.time() - start, 1),
    )
    table = benchmark.markdown_table(results)
    print(table)
    for path in (args.json, args.markdown):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    benchmark.write(results, args.json, None)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(benchmark.markdown(results))
    return results


command = exit_zero(main)


if __name__ == "__main__":
    main()
