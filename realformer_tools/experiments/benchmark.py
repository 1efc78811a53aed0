"""Training speed and memory of RealFormer against fairseq's ``transformer``, measured where
users train.

Every variant is built with the same weights and timed in the same process on the same batch;
the variants are interleaved round by round (round r of every variant ran under the same load)
and each speed is reported as the median of its per-round ratios to ``vanilla``, with their
range. Per row (size, tokens per batch, T, dtype):

* train: forward + backward + Adam step on ``tokens // T`` sentences of ``T`` source and target
  tokens (``padded``: half to all of ``T``), in training mode with the arch's own dropout (the big
  arch's attention dropout 0.1 included); CUDA events per step on CUDA, its wall time beside;
* host and GPU apart: for one step per variant, the time the GPU was busy (the union of the
  device-kernel intervals ``torch.profiler`` records) over the median step time. A row where a variant's
  GPU is busy less than :data:`GPU_BOUND` of its step is host-bound: it does not rank kernels;
* memory: on CUDA ``torch.cuda.max_memory_allocated`` during a step, minus what was allocated before it,
  plus the variant's parameters and Adam state (a process training that variant alone); on CPU the rise
  of a fresh process's peak RSS over a step; and the bytes autograd saves for backward;
* decode (``decode_alternations`` > 0): beam search over ``decode_sentences`` sources of length ``T``;
* first pass (:func:`first_pass`): one train step at each of many lengths not seen before,
  per variant: the compile cost a run pays when its batches bring new lengths.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import time
import types

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from realformer_nmt.modules.residual_attention import KERNELS

SIZES = {  # name -> (vanilla arch, RealFormer arch); fairseq's dims
    "iwslt": ("transformer_iwslt_de_en", "realformer_transformer_iwslt_de_en"),
    "base": ("transformer", "realformer_transformer"),
    "big": ("transformer_wmt_en_de_big", "realformer_transformer_wmt_en_de_big"),
    "toy": ("transformer", "realformer_transformer"),  # with TOY below: CI smoke runs
}
TOY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
           encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64,
           encoder_attention_heads=4, decoder_attention_heads=4)
SIZE_OVERRIDES = {"toy": TOY}
# name -> (uses the RealFormer arch, extra model args): vanilla, then every kernel, then auto
VARIANTS = {"vanilla": (False, {})}
VARIANTS.update({k: (True, {"residual_attention_kernel": k}) for k in KERNELS if k != "auto"})
VARIANTS["auto"] = (True, {"residual_attention_kernel": "auto"})
# A row ranks kernels only where every variant's GPU is busy at least this share of its step:
# there a kernel that is x% slower moves the step by at least 0.8 x x%, while host jitter can
# only move the idle rest (at most a fifth). At 4-8k tokens per batch a base-size step is
# about 40-50 ms of host work around a few ms of kernels (busy ~10%): its per-round ratios
# ranged 0.5x-1.4x for every variant on one H200, residual paths off included.
GPU_BOUND = 0.8
HOST_BOUND_ROUNDS = 15  # a host-bound row's median needs at least this many rounds


def make_dictionary(vocab):
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    return d


def arch_args(size, variant, mode="sum"):
    """``(arch, args)``: the arch's own defaults (its dropouts included) for ``variant``."""
    realformer, extra = VARIANTS[variant]
    arch = SIZES[size][1 if realformer else 0]
    args = argparse.Namespace(**SIZE_OVERRIDES.get(size, {}), **extra)
    if realformer:
        args.residual_attention_mode = mode
    ARCH_CONFIG_REGISTRY[arch](args)
    return arch, args


def build_model(size, variant, dictionary, mode="sum", device="cpu", dtype=torch.float32, seed=0):
    arch, args = arch_args(size, variant, mode)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)  # same seed, same parameter names and order: same weights
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device=device, dtype=dtype)


def random_batch(dictionary, bsz, src_len, tgt_len, device, seed=0, padded=False):
    """``padded``: lengths from half to all of T, sources left-padded, targets right-padded (fairseq's)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.cat([torch.full((bsz, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    lengths = torch.full((bsz,), src_len)
    if padded:
        lengths = torch.randint((src_len + 1) // 2, src_len + 1, (bsz,), generator=g)
        src[torch.arange(src_len) < (src_len - lengths)[:, None]] = dictionary.pad()
        short = torch.arange(tgt_len) >= torch.randint((tgt_len + 1) // 2, tgt_len + 1, (bsz, 1), generator=g)
        prev[short], tgt[short] = dictionary.pad(), dictionary.pad()
    return src.to(device), lengths.to(device), prev.to(device), tgt.to(device)


def adam(model):
    """Adam on the model's own dtype. In float16 its default eps (1e-8) is 0, and a
    parameter with no gradient (the padding embedding) becomes 0/0 = NaN: 1e-4 there."""
    half = next(model.parameters()).dtype == torch.float16
    return torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4 if half else 1e-8)


def train_step(model, optimizer, batch):
    """Forward, cross-entropy, backward, Adam step."""
    src, lengths, prev, tgt = batch
    optimizer.zero_grad(set_to_none=True)
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def saved_activation_bytes(model, batch):
    """Bytes autograd keeps for backward during one forward (distinct storages)."""
    seen = {}

    def pack(t):
        try:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        # detached: a saved output packed as itself refers back to its own grad_fn, a
        # reference cycle that kept every forward's graph alive (about 1 GiB per call at T=512)
        return t.detach()

    src, lengths, prev, tgt = batch
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, _ = model(src, lengths, prev)
    del logits
    return sum(n for ptr, n in seen.items() if ptr not in params)


def _peak_memory_child(queue, size, variant, vocab, bsz, length, mode, device, dtype_name):
    """Runs in a fresh process: peak memory of train steps of one variant."""
    import realformer_nmt  # noqa: F401  (registers the archs in the child)

    dtype = getattr(torch, dtype_name)
    dictionary = make_dictionary(vocab)
    model = build_model(size, variant, dictionary, mode, device, dtype).train()
    optimizer = adam(model)
    batch = random_batch(dictionary, bsz, length, length, device)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            train_step(model, optimizer, batch)
        queue.put(torch.cuda.max_memory_allocated() / 2**20)
        return
    train_step(model, optimizer, batch)  # Adam state and allocator pools exist from here on
    before = _status_mib("VmRSS")
    _reset_peak_rss()
    train_step(model, optimizer, batch)
    queue.put(_status_mib("VmHWM") - before)


def _reset_peak_rss():
    """Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    raise RuntimeError(f"{field} not in /proc/self/status")


def state_bytes(model, optimizer):
    """Bytes of the parameters and the optimizer state (Adam's moments)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))
    return total


def cuda_peak_mb(model, optimizer, batch):
    """Peak CUDA memory of one train step of ``model``, as if it were alone on the device:
    ``max_memory_allocated`` during the step minus what was allocated before it, plus the
    model's parameters and optimizer state (gradients are freed first, so they count in the
    step). Run after a first step, so the optimizer state exists."""
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    train_step(model, optimizer, batch)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before + state_bytes(model, optimizer)) / 2**20


def peak_memory_mb(size, variant, vocab, bsz, length, mode, device, dtype):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_peak_memory_child,
                       args=(queue, size, variant, vocab, bsz, length, mode, str(device),
                             str(dtype).replace("torch.", "")))
    # glibc: every allocation over 128 KiB is its own mapping, returned when freed, so
    # RSS follows the memory tensors actually hold (no dynamic threshold, no arena reuse)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    try:
        proc.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    try:
        value = queue.get(timeout=1800)
    finally:
        proc.join()
    return value


def decode_seconds(model, dictionary, batch, beam, decode_len, device):
    src, lengths = batch[0], batch[1]
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=decode_len,
                                  min_len=decode_len)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    _sync(device)
    return time.perf_counter() - start


def _cuda(device):
    return torch.device(device).type == "cuda"


def _sync(device):
    if _cuda(device):
        torch.cuda.synchronize()


def timed_step(model, optimizer, batch, device):
    """``(seconds, wall seconds)`` of one train step: CUDA events around it on CUDA (the
    step's span on the GPU's stream), ``perf_counter`` on CPU (both values the same)."""
    _sync(device)
    start = time.perf_counter()
    if not _cuda(device):
        train_step(model, optimizer, batch)
        wall = time.perf_counter() - start
        return wall, wall
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    train_step(model, optimizer, batch)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000, time.perf_counter() - start


def busy_length(intervals) -> float:
    """The length of the union of ``(start, end)`` intervals (overlapping kernels count once)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def gpu_busy_seconds(model, optimizer, batch, device):
    """Seconds the GPU was busy during one train step (union of the device-kernel intervals
    the profiler records), or None off CUDA or where it recorded none."""
    if not _cuda(device):
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train_step(model, optimizer, batch)
        _sync(device)
    intervals = [(e.time_range.start, e.time_range.end) for e in prof.events()
                 if getattr(e, "device_type", None) == DeviceType.CUDA]
    return busy_length(intervals) / 1e6 if intervals else None


def per_round_ratios(config, variant, key="train_step_seconds_all"):
    """``variant``'s speed as a multiple of vanilla's, one ratio per interleaved round."""
    base = config["variants"].get("vanilla", {}).get(key) or []
    mine = config["variants"].get(variant, {}).get(key) or []
    return [b / m for b, m in zip(base, mine) if m]


def run_config(size, length, variants, *, tokens, alternations, warmup, beam=4, decode_sentences=8,
               decode_len=None, vocab, mode, device, dtype, memory=True, decode_alternations=0, padded=False,
               log=print):
    """One row: every variant's train steps interleaved round by round, the GPU's busy share of one step each,
    memory, and (``decode_alternations`` > 0) beam search. A variant that raises while built or trained (a
    kernel that fails here, memory) leaves the row, its error kept in ``failed``; the others go on."""
    dictionary = make_dictionary(vocab)
    bsz = max(1, tokens // length)
    models, optimizers, failed = {}, {}, {}

    def fails(v, exc):  # any failure of one variant: said, the row goes on without it
        failed[v] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        log(f"  {v} failed, left out of the row: {failed[v]}")
        models.pop(v, None), optimizers.pop(v, None)

    for v in variants:
        try:
            models[v] = build_model(size, v, dictionary, mode, device, dtype).train()
        except Exception as exc:  # noqa: BLE001
            fails(v, exc)
    first = next(iter(models.values())).state_dict()
    for m in models.values():  # identical weights, whatever the arch function built
        m.load_state_dict(first)
    optimizers.update({v: adam(m) for v, m in models.items()})
    batch = random_batch(dictionary, bsz, length, length, device, padded=padded)
    name = f"  {size} {tokens} tokens T={length} {str(dtype).replace('torch.', '')}" + (" padded" if padded else "")
    train = {v: [] for v in variants}
    wall = {v: [] for v in variants}
    for r in range(warmup + alternations):
        for v, model in list(models.items()):
            try:
                seconds, w = timed_step(model, optimizers[v], batch, device)
            except Exception as exc:  # noqa: BLE001
                fails(v, exc)
                continue
            if r >= warmup:
                train[v].append(seconds)
                wall[v].append(w)
        log(f"{name}: train round {r + 1}/{warmup + alternations}")
    busy = {v: gpu_busy_seconds(m, optimizers[v], batch, device) for v, m in models.items()}
    activations = {v: saved_activation_bytes(m, batch) / 2**20 for v, m in models.items()}
    peaks = {}
    if memory and _cuda(device):
        peaks = {v: cuda_peak_mb(m, optimizers[v], batch) for v, m in models.items()}
    decode = {v: [] for v in variants}
    n_dec = min(decode_sentences, bsz)
    if decode_alternations:
        dec_batch = random_batch(dictionary, n_dec, length, length, device, seed=1)
        for m in models.values():
            m.eval()
        for r in range(1 + decode_alternations):
            for v, model in models.items():
                t = decode_seconds(model, dictionary, dec_batch, beam, decode_len or min(length, 64), device)
                if r >= 1:
                    decode[v].append(t)
            log(f"{name}: decode round {r + 1}/{1 + decode_alternations}")
    args = arch_args(size, variants[0], mode)[1]
    variants = [v for v in variants if v in models]
    models.clear()
    optimizers.clear()
    if memory and not _cuda(device):
        peaks = {v: peak_memory_mb(size, v, vocab, bsz, length, mode, device, dtype) for v in variants}
    out = {"size": size, "length": length, "dtype": str(dtype).replace("torch.", ""), "tokens_per_batch": tokens,
           "batch_sentences": bsz, "train_tokens": bsz * length, "rounds": alternations,
           "dropout": args.dropout, "attention_dropout": args.attention_dropout, "padded": padded, "failed": failed,
           "timing": "CUDA events per step" if _cuda(device) else "perf_counter per step",
           "peak_memory": ("cuda max_memory_allocated, same process" if _cuda(device) else "process peak RSS rise")
           if memory else None, "decode_sentences": n_dec, "variants": {}}
    for v in variants:
        tr = statistics.median(train[v])
        out["variants"][v] = {
            "train_step_seconds": tr, "train_tokens_per_second": bsz * length / tr,
            "train_step_seconds_all": train[v], "train_wall_seconds_all": wall[v],
            "gpu_busy_seconds": busy[v], "gpu_busy_fraction": None if busy[v] is None else min(1.0, busy[v] / tr),
            "saved_activations_mib": activations[v], "peak_memory_mib": peaks.get(v),
            "decode_sentences_per_second": n_dec / statistics.median(decode[v]) if decode[v] else None,
            "decode_seconds_all": decode[v],
        }
    fractions = [r["gpu_busy_fraction"] for r in out["variants"].values()]
    out["gpu_busy_min"] = None if None in fractions else min(fractions)
    out["host_bound"] = None if out["gpu_busy_min"] is None else out["gpu_busy_min"] < GPU_BOUND
    if "vanilla" in variants:
        b = out["variants"]["vanilla"]
        for v, r in out["variants"].items():
            ratios = per_round_ratios(out, v)
            r["train_speed_ratio"] = statistics.median(ratios)
            r["train_speed_low"], r["train_speed_high"] = min(ratios), max(ratios)
            decoded = per_round_ratios(out, v, "decode_seconds_all")
            r["decode_speed_ratio"] = statistics.median(decoded) if decoded else None
            r["activation_ratio"] = r["saved_activations_mib"] / b["saved_activations_mib"]
            r["peak_memory_ratio"] = (r["peak_memory_mib"] / b["peak_memory_mib"]
                                      if r["peak_memory_mib"] and b["peak_memory_mib"] else None)
    return out


def first_pass(size, variants, lengths, *, tokens, vocab, mode, device, dtype, log=print):
    """One train step at each of ``lengths`` (none seen before), variants interleaved per
    length, after one warm-up step at another length: the total per variant and its ratio to
    vanilla's (what compiling kernels for new shapes costs a run whose batch lengths vary)."""
    dictionary = make_dictionary(vocab)
    models = {v: build_model(size, v, dictionary, mode, device, dtype).train() for v in variants}
    optimizers = {v: adam(m) for v, m in models.items()}
    warm = random_batch(dictionary, max(1, tokens // 64), 64, 64, device)
    for v, m in models.items():
        timed_step(m, optimizers[v], warm, device)
    seconds = {v: [] for v in variants}
    for i, length in enumerate(lengths):
        batch = random_batch(dictionary, max(1, tokens // length), length, length, device, seed=i)
        for v, m in models.items():
            seconds[v].append(timed_step(m, optimizers[v], batch, device)[1])
        log(f"  first pass: T={length} ({i + 1}/{len(lengths)})")
    totals = {v: sum(s) for v, s in seconds.items()}
    return {"size": size, "dtype": str(dtype).replace("torch.", ""), "tokens_per_batch": tokens,
            "lengths": list(lengths), "seconds_all": seconds, "seconds": totals,
            "ratio_to_vanilla": {v: t / totals["vanilla"] for v, t in totals.items()} if "vanilla" in totals else None}


def row_key(config):
    return config["size"], config["tokens_per_batch"], config["length"], config["dtype"]


def run_benchmark(sizes, tokens, lengths, dtypes, variants, *, deadline=None, done=(), on_row=None, log=print, **kw):
    """Every (size, tokens, T, dtype) row not in ``done`` (row keys), in that order;
    ``on_row(config)`` after each; with ``deadline`` (a ``time.time()``), rows that would
    start after it are listed in ``not_run``."""
    configs, not_run = [], []
    for size in sizes:
        for tok in tokens:
            for dtype in dtypes:
                for length in lengths:
                    key = (size, tok, length, str(dtype).replace("torch.", ""))
                    if key in done:
                        continue
                    if deadline is not None and time.time() > deadline:
                        not_run.append(list(key))
                        continue
                    log(" ".join(map(str, key)))
                    config = run_config(size, length, variants, tokens=tok, dtype=dtype, log=log, **kw)
                    configs.append(config)
                    if on_row:
                        on_row(config)
    return {"configs": configs, "not_run": not_run}


def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown_table(result):
    """One line per (row, variant): tokens per batch beside every row; train speed with the
    median of the per-round ratios to vanilla and their range; the GPU's busy share of a step;
    memory. A host-bound row (GPU busy below ``GPU_BOUND``) says it does not rank kernels."""
    lines = ["| size | tokens/batch | T | dtype | variant | train tok/s | x vanilla: median (range), rounds "
             "| GPU busy | peak MiB | x vanilla | saved MiB | beam sent/s | x vanilla |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    older = False  # a result written before the per-round range was stored: its ratio is of the medians
    for c in result["configs"]:
        for v, r in c["variants"].items():
            low, high = r.get("train_speed_low"), r.get("train_speed_high")
            if low is None and r.get("train_speed_ratio") is not None and "vanilla" in c["variants"]:
                older, ratios = True, per_round_ratios(c, v)  # the range from its per-round step times
                low, high = (min(ratios), max(ratios)) if ratios else (None, None)
            spread = "" if low is None else f" ({_f(low)}-{_f(high)})"
            ratio = (f"{_f(r.get('train_speed_ratio'))}{spread}, "
                     f"{c.get('rounds', len(r['train_step_seconds_all']))}")
            busy = "-" if r.get("gpu_busy_fraction") is None else f"{100 * r['gpu_busy_fraction']:.0f}%"
            tokens, dtype = c.get("tokens_per_batch") or c.get("train_tokens"), c.get("dtype", result.get("dtype"))
            lines.append(f"| {c['size']} | {tokens} | {c['length']} | {dtype} | {v} | "
                         f"{r['train_tokens_per_second']:.0f} | {ratio} | "
                         f"{busy} | {_f(r.get('peak_memory_mib'), 0)} | {_f(r.get('peak_memory_ratio'))} | "
                         f"{r['saved_activations_mib']:.0f} | {_f(r.get('decode_sentences_per_second'))} | "
                         f"{_f(r.get('decode_speed_ratio'))} |")
    notes = [f"- {c['size']}, {c['tokens_per_batch']} tokens, T = {c['length']}, {c['dtype']}: host-bound (GPU busy "
             f"{100 * c['gpu_busy_min']:.0f}% of a step at least once, below {100 * GPU_BOUND:.0f}%): it does not rank "
             "kernels" for c in result["configs"] if c.get("host_bound")]
    if older:
        notes.append("- x vanilla: vanilla's median step time over this variant's (this run predates the median of "
                     "the per-round ratios); the range is of the per-round ratios")
    notes += [f"- not run (deadline): {' '.join(map(str, k))}" for k in result.get("not_run", [])]
    for p in result.get("first_pass", []):
        notes.append(f"- first pass over {len(p['lengths'])} new lengths ({p['size']}, {p['dtype']}, "
                     f"{p['tokens_per_batch']} tokens): " + ", ".join(
                         f"{v} {s:.1f}s" + (f" ({p['ratio_to_vanilla'][v]:.2f}x)" if p['ratio_to_vanilla'] else "")
                         for v, s in p["seconds"].items()))
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def markdown(result):
    """The whole Markdown file: command, machine and ``markdown_table``."""
    return (f"Command: `{result['command']}`  \nMachine: {result['machine']}, torch {result['torch']}, "
            f"{result['threads']} threads, {result.get('gpu') or result['device']}\n\n{markdown_table(result)}")


def write(result, json_path=None, md_path=None):
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if md_path:
        with open(md_path, "w") as f:
            f.write(markdown(result))
