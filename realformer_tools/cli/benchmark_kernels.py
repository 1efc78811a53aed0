#!/usr/bin/env python
"""Residual-attention kernels timed against each other, attention alone (forward + backward).

For every length and mask (non-causal = encoder self / cross paths, causal = decoder
self path) it times a stack of ``--layers`` attention modules with every kernel, every
(first layer, later layers) pair of kernels, and fairseq's vanilla attention, interleaved
in one process (on CUDA also each one's peak memory); prints one line per configuration
and writes JSON. The CUDA rule of ``auto`` comes from whole-model rows where the GPU is the
bottleneck (``scripts/benchmark_speed.py``, the GPU check), not from attention alone.

  python scripts/benchmark_kernels.py --json results/kernel_timing_cpu.json
  python scripts/benchmark_kernels.py --device cuda --dtype float16 --lengths 128,512,1024 \
      --json results/gpu/kernel_timing_float16.json
"""

import argparse
import json
import os
import sys

from ._common import comma_list, exit_zero


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=comma_list(int), default=[32, 64, 128, 256, 512],
                   help="sequence lengths T = S (default: %(default)s)")
    p.add_argument("--masks", type=comma_list(str, ("noncausal", "causal")), default=["noncausal", "causal"],
                   help="comma list of noncausal, causal (default: both)")
    p.add_argument("--layers", type=int, default=6, help="layers in the stack (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="batch size B (default: %(default)s)")
    p.add_argument("--embed-dim", type=int, default=512, help="model dim (default: %(default)s)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds; medians reported (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    masks = args.masks
    if args.embed_dim % args.heads:
        p.error("--embed-dim must be a multiple of --heads")

    import torch

    from realformer_tools.experiments import kernel_timing

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = kernel_timing.run(
        args.lengths, [m == "causal" for m in masks], args.layers, args.batch, args.embed_dim, args.heads,
        args.dropout, args.rounds, args.warmup, device, getattr(torch, args.dtype),
        log=lambda m: print(m, flush=True),
    )
    result["command"] = "python scripts/benchmark_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


command = exit_zero(main)


if __name__ == "__main__":
    main()
