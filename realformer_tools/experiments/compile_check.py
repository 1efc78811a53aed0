"""Does ``torch.compile`` work on a RealFormer translation model, and what does it buy?

For each variant (fairseq's ``transformer``, RealFormer with the ``auto`` kernel, RealFormer
``materialized``), an eager model and a ``torch.compile``'d twin with the same weights:

* compile time: the compiled twin's first forward + backward (graph capture, inductor's
  code generation and C++ builds), minus an eager step;
* equality: logits and every gradient of that first step against eager (max abs diff);
* graphs: how many graphs TorchDynamo made, with the graph-break reasons;
* steady state: training steps (forward, backward, Adam step), eager and compiled
  interleaved step by step so machine load hits both alike; medians and the ratio
  compiled / eager; and how far apart the two models' weights are after those steps.

Dropout is off (compiled code draws its own random numbers, so only dropout-free runs
can be compared number for number; on CPU ``auto`` runs ``materialized``). Inductor's
on-disk cache is a fresh temporary folder unless ``--warm-cache``, so compile times are
cold-start times.

Run: ``python -m realformer_tools.experiments.compile_check --json out.json``. Each
variant's result is written as soon as it is measured; re-running with the same
settings skips the variants already in the file.

``--triton``: the other compile check, the ``triton`` kernels compiled by Triton's own compiler
for sm_80, sm_86 and sm_90 without a GPU (registers, spills, shared memory, SASS instructions;
``triton_compile.py``, whose flags follow it).
"""

import argparse
import copy
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

VARIANTS = {
    "vanilla": ("transformer", {}),
    "realformer_auto": ("realformer_transformer", {"residual_attention_kernel": "auto"}),
    "realformer_materialized": ("realformer_transformer", {"residual_attention_kernel": "materialized"}),
}


def small_dims(layers=3, embed=128, ffn=256, heads=4):
    return dict(
        encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=embed, decoder_embed_dim=embed,
        encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )


def build_model(arch, dictionary, dims, overrides):
    """A model built through fairseq's registries, as fairseq-train builds it."""
    args = argparse.Namespace(**dims, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


def random_batch(dictionary, bsz, src_len, tgt_len, seed=0):
    """Random tokens; the first source row left-padded by a quarter (padding masks in play)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    src[:, -1] = dictionary.eos()
    src[0, : src_len // 4] = dictionary.pad()
    tgt[:, 0] = dictionary.eos()
    return src, src.ne(dictionary.pad()).sum(1), tgt


def _forward_backward(model, batch):
    src, lengths, tgt = batch
    logits, _ = model(src, lengths, tgt)
    target = torch.roll(tgt, -1, dims=1)
    loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), target)
    loss.backward()
    return logits.detach()


def _train_step(model, optimizer, batch):
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    _forward_backward(model, batch)
    optimizer.step()
    return time.perf_counter() - start


def _graph_breaks():
    from torch._dynamo.utils import counters

    return {reason.strip().splitlines()[0]: n for reason, n in counters["graph_break"].items()}


def check_variant(name, dims, bsz, src_len, tgt_len, steps, warmup, backend, vocab=1000, log=print):
    """Measure one variant; returns a JSON-ready dict."""
    arch, overrides = VARIANTS[name]
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    eager = build_model(arch, dictionary, dims, overrides).train()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, backend=backend)
    batch = random_batch(dictionary, bsz, src_len, tgt_len)

    start = time.perf_counter()
    expected = _forward_backward(eager, batch)
    eager_first = time.perf_counter() - start
    log(f"[{name}] compiling ({backend}) ...")
    start = time.perf_counter()
    got = _forward_backward(compiled, batch)
    compiled_first = time.perf_counter() - start
    grad_diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(eager.parameters(), twin.parameters()))
    result = {
        "arch": arch, "overrides": overrides,
        "compile_s": compiled_first - eager_first,
        "first_step_s": {"eager": eager_first, "compiled": compiled_first},
        "max_abs_diff": {"logits": (expected - got).abs().max().item(), "grads": grad_diff},
        "graphs": sum(counters["stats"].get(k, 0) for k in ("unique_graphs",)),
        "graph_breaks": _graph_breaks(),
    }
    log(f"[{name}] compile {result['compile_s']:.1f} s, graphs {result['graphs']}, "
        f"max diff logits {result['max_abs_diff']['logits']:.2e} grads {grad_diff:.2e}")

    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-4)
    opt_c = torch.optim.Adam(twin.parameters(), lr=1e-4)
    times = {"eager": [], "compiled": []}
    for step in range(warmup + steps):
        for key, model, opt in (("eager", eager, opt_e), ("compiled", compiled, opt_c)):
            t = _train_step(model, opt, batch)
            if step >= warmup:
                times[key].append(t)
        if (step + 1) % max(1, (warmup + steps) // 5) == 0:
            log(f"[{name}] step {step + 1}/{warmup + steps}")
    med = {k: statistics.median(v) for k, v in times.items()}
    result["train_step_median_s"] = med
    result["ratio_compiled_over_eager"] = med["compiled"] / med["eager"]
    result["max_abs_weight_diff_after_steps"] = max(
        (p - q).abs().max().item() for p, q in zip(eager.parameters(), twin.parameters())
    )
    result["recompiles_after_first_step"] = counters["stats"].get("unique_graphs", 0) - result["graphs"]
    log(f"[{name}] train step eager {med['eager'] * 1e3:.1f} ms, compiled {med['compiled'] * 1e3:.1f} ms, "
        f"ratio {result['ratio_compiled_over_eager']:.2f}")
    return result


def environment(backend):
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx[-1] if isinstance(inductor_config.cpp.cxx, tuple) else inductor_config.cpp.cxx
    return {
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "backend": backend, "cxx": os.path.basename(shutil.which(cxx or "g++") or "") or None,
        "load_average_at_start": os.getloadavg(),
    }


def run(variants, dims, bsz, src_len, tgt_len, steps, warmup, backend, json_path=None, warm_cache=False,
        log=print):
    settings = {"dims": dims, "bsz": bsz, "src_len": src_len, "tgt_len": tgt_len, "steps": steps,
                "warmup": warmup, "backend": backend, "warm_cache": warm_cache}
    report = {"settings": settings, "environment": environment(backend), "results": {}}
    if json_path and Path(json_path).exists():
        previous = json.loads(Path(json_path).read_text())
        if previous.get("settings") == settings:
            report = previous
            done = [v for v in variants if v in report["results"]]
            if done:
                log(f"resuming: {', '.join(done)} already measured in {json_path}")
    for name in variants:
        if name in report["results"]:
            continue
        with tempfile.TemporaryDirectory(prefix="inductor_cache_") as cache:
            if not warm_cache:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            report["results"][name] = check_variant(name, dims, bsz, src_len, tgt_len, steps, warmup, backend,
                                                    log=log)
        report["environment"]["load_average_at_end"] = os.getloadavg()
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--triton" in argv:
        from . import triton_compile

        return triton_compile.main([a for a in argv if a != "--triton"])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--triton", action="store_true",
                   help="instead: compile the triton kernels for sm_80/86/90 without a GPU (triton_compile.py: "
                        "--archs, --dims, --dtypes, --only, --json, --markdown follow)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers (default 3)")
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--ffn-dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="timed train steps per model (default 20)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--warm-cache", action="store_true", help="use inductor's usual on-disk cache")
    p.add_argument("--json", help="write (and resume from) this JSON file")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    report = run(variants, small_dims(args.layers, args.embed_dim, args.ffn_dim, args.heads), args.batch_size,
                 args.src_len, args.tgt_len, args.steps, args.warmup, args.backend, args.json, args.warm_cache)
    print(json.dumps({k: {m: v[m] for m in ("compile_s", "ratio_compiled_over_eager", "max_abs_diff", "graphs")}
                      for k, v in report["results"].items()}, indent=2))


if __name__ == "__main__":
    main()
