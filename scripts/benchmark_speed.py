#!/usr/bin/env python
"""Speed of realformer_transformer vs fairseq's transformer, in the same run.

Prints one line per variant with the time ratio to vanilla and writes JSON.
Example: python scripts/benchmark_speed.py --json runs/bench/speed_cpu.json
"""

import argparse
import json
import os
import sys

import torch

import realformer_nmt  # noqa: F401  (registers the model)
from realformer_nmt.experiments.benchmark import VARIANTS, run_benchmark


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--bsz", type=int, default=16)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--steps", type=int, default=10, help="timed training steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    dims = dict(
        encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_embed_dim=args.embed_dim, decoder_embed_dim=args.embed_dim,
        encoder_ffn_embed_dim=args.ffn_dim, decoder_ffn_embed_dim=args.ffn_dim,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
    )
    result = run_benchmark(
        dims, variants, args.bsz, args.src_len, args.tgt_len, args.steps, args.warmup, args.beam,
        args.vocab, args.device, getattr(torch, args.dtype), log=lambda m: print(m, file=sys.stderr),
    )
    for name, r in result["variants"].items():
        print(f"{name:16s} train step {r['train_step_seconds'] * 1000:8.1f} ms  "
              f"(x{r['train_time_ratio_to_vanilla']:.3f} vanilla)   decode {r['decode_seconds']:.3f} s  "
              f"(x{r['decode_time_ratio_to_vanilla']:.3f} vanilla)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
