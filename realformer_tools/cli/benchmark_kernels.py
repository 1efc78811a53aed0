#!/usr/bin/env python
"""Residual-attention kernels timed against each other: the measurements behind
``--residual-attention-kernel auto`` (attention alone, forward + backward).

For every length and mask (non-causal = encoder self / cross paths, causal = decoder
self path) it times a stack of ``--layers`` attention modules with every kernel, every
(first layer, later layers) pair of kernels, hybrids fused for the first m layers, and
fairseq's vanilla attention, interleaved in one process (on CUDA also each one's peak
memory); prints one line per configuration and writes JSON. ``--rule`` writes the rule
``auto`` would apply on that device (fastest kernel per position with memory not above
materialized) in the schema of the rule the package ships
(``realformer_nmt/modules/residual_attention/kernel_rule.json``, what ``auto`` applies).

  python scripts/benchmark_kernels.py --json results/kernel_timing_cpu.json
  python scripts/benchmark_kernels.py --device cuda --dtype float16 --lengths 128,512,1024 \
      --json results/gpu/kernel_timing_float16.json --rule results/gpu/kernel_rule.json
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
    p.add_argument("--switch-points", type=comma_list(int), default=[2, 3, 4],
                   help="hybrids: fused for the first m layers, then materialized (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="batch size B (default: %(default)s)")
    p.add_argument("--embed-dim", type=int, default=512, help="model dim (default: %(default)s)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds; medians reported (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--rule", help="write the derived kernel rule here (kernel_rule.json schema)")
    args = p.parse_args(argv)
    masks = args.masks
    if args.embed_dim % args.heads:
        p.error("--embed-dim must be a multiple of --heads")

    import torch

    from realformer_tools.experiments import kernel_timing

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = kernel_timing.run(
        args.lengths, [m == "causal" for m in masks], args.layers, args.batch, args.embed_dim, args.heads,
        args.dropout, args.switch_points, args.rounds, args.warmup, device, getattr(torch, args.dtype),
        log=lambda m: print(m, flush=True),
    )
    result["command"] = "python scripts/benchmark_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rule = kernel_timing.kernel_rule(result, result["command"]) if args.rule else None
    for path, obj in ((args.json, result), (args.rule, rule)):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(obj, f, indent=2)
    if rule:
        print(f"rule: first layer {rule['rule']['first_layer']}, later layers {rule['rule']['later_layers']} "
              f"-> {args.rule}")
    return result


command = exit_zero(main)


if __name__ == "__main__":
    main()
