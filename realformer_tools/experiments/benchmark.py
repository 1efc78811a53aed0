"""Training and decoding speed and memory of RealFormer against fairseq's transformer.

Every variant is built with the same weights and timed in the same process on the same
batches, interleaved step by step (so machine load hits all alike); medians of the
alternations are reported with ratios to ``vanilla`` (absolute times on a shared
machine are noise, side-by-side ratios are not).

Per (size, length):
* train: forward + backward + Adam step on ``tokens`` target tokens (``tokens // T``
  sentences of ``T`` source and ``T`` target tokens), in training mode with the arch's
  own dropout settings; tokens/s counts target tokens, as fairseq's ``wps`` does;
* memory: peak memory of a train step. On CPU, in a fresh process per variant: the
  rise of the process's peak RSS during the second train step over its RSS before it
  (activations and gradients; Adam state exists by then). On CUDA, in the same process
  (the caching allocator counts every byte, so no fresh process is needed):
  ``torch.cuda.max_memory_allocated`` during a train step of the variant, minus what was
  allocated before it (the other variants' models and states), plus the variant's own
  parameters and Adam state, i.e. what a process training that variant alone would
  peak at. Plus the bytes autograd saves for backward (a deterministic count of
  activation memory);
* decode: fairseq's ``SequenceGenerator`` beam search (cached decoding) over
  ``decode_sentences`` sources of length ``T``, generating up to ``decode_len`` tokens;
  sentences/s.
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
# name -> (uses the RealFormer arch, extra model args): vanilla, then every kernel
VARIANTS = {"vanilla": (False, {})}
VARIANTS.update({k: (True, {"residual_attention_kernel": k}) for k in KERNELS if k != "auto"})
VARIANTS["auto"] = (True, {"residual_attention_kernel": "auto"})


def make_dictionary(vocab):
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    return d


def build_model(size, variant, dictionary, mode="sum", device="cpu", dtype=torch.float32, seed=0):
    realformer, extra = VARIANTS[variant]
    arch = SIZES[size][1 if realformer else 0]
    args = argparse.Namespace(**SIZE_OVERRIDES.get(size, {}), **extra)
    if realformer:
        args.residual_attention_mode = mode
    ARCH_CONFIG_REGISTRY[arch](args)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)  # same seed, same parameter names and order: same weights
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device=device, dtype=dtype)


def random_batch(dictionary, bsz, src_len, tgt_len, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.cat([torch.full((bsz, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    lengths = torch.full((bsz,), src_len)
    return src.to(device), lengths.to(device), prev.to(device), tgt.to(device)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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


def run_config(size, length, variants, *, tokens, alternations, warmup, beam, decode_sentences,
               decode_len, vocab, mode, device, dtype, memory=True, decode_alternations=None, log=print):
    dictionary = make_dictionary(vocab)
    bsz = max(1, tokens // length)
    models = {v: build_model(size, v, dictionary, mode, device, dtype).train() for v in variants}
    first = next(iter(models.values())).state_dict()
    for m in models.values():  # identical weights, whatever the arch function built
        m.load_state_dict(first)
    optimizers = {v: adam(m) for v, m in models.items()}
    batch = random_batch(dictionary, bsz, length, length, device)
    train = {v: [] for v in variants}
    for r in range(warmup + alternations):
        for v, model in models.items():
            _sync(device)
            start = time.perf_counter()
            train_step(model, optimizers[v], batch)
            _sync(device)
            if r >= warmup:
                train[v].append(time.perf_counter() - start)
        log(f"  {size} T={length}: train round {r + 1}/{warmup + alternations}")
    activations = {v: saved_activation_bytes(m, batch) / 2**20 for v, m in models.items()}
    cuda = torch.device(device).type == "cuda"
    peaks = {}
    if memory and cuda:
        for v, m in models.items():
            peaks[v] = cuda_peak_mb(m, optimizers[v], batch)
            log(f"  {size} T={length}: peak memory {v} {peaks[v]:.0f} MiB")
    decode_alternations = alternations if decode_alternations is None else decode_alternations
    dec_batch = random_batch(dictionary, min(decode_sentences, bsz), length, length, device, seed=1)
    decode = {v: [] for v in variants}
    for m in models.values():
        m.eval()
    for r in range(1 + decode_alternations):
        for v, model in models.items():
            t = decode_seconds(model, dictionary, dec_batch, beam, decode_len, device)
            if r >= 1:
                decode[v].append(t)
        log(f"  {size} T={length}: decode round {r + 1}/{1 + decode_alternations}")
    del models, optimizers
    if memory and not cuda:
        for v in variants:
            peaks[v] = peak_memory_mb(size, v, vocab, bsz, length, mode, device, dtype)
            log(f"  {size} T={length}: peak memory {v} {peaks[v]:.0f} MiB")
    n_dec = dec_batch[0].size(0)
    out = {"size": size, "length": length, "batch_sentences": bsz, "train_tokens": bsz * length,
           "decode_sentences": n_dec, "decode_len": decode_len,
           "peak_memory": ("cuda max_memory_allocated, same process" if cuda else "process peak RSS rise")
           if memory else None, "variants": {}}
    base = "vanilla" if "vanilla" in variants else None
    for v in variants:
        tr, de = statistics.median(train[v]), statistics.median(decode[v])
        out["variants"][v] = {
            "train_step_seconds": tr,
            "train_tokens_per_second": bsz * length / tr,
            "decode_sentences_per_second": n_dec / de,
            "saved_activations_mib": activations[v],
            "peak_memory_mib": peaks.get(v),
            "train_step_seconds_all": train[v],
            "decode_seconds_all": decode[v],
        }
    if base:
        b = out["variants"][base]
        for r in out["variants"].values():
            r["train_speed_ratio"] = r["train_tokens_per_second"] / b["train_tokens_per_second"]
            r["decode_speed_ratio"] = r["decode_sentences_per_second"] / b["decode_sentences_per_second"]
            r["activation_ratio"] = r["saved_activations_mib"] / b["saved_activations_mib"]
            r["peak_memory_ratio"] = (r["peak_memory_mib"] / b["peak_memory_mib"]
                                      if r["peak_memory_mib"] and b["peak_memory_mib"] else None)
    return out


def run_benchmark(sizes, lengths, variants, *, log=print, **kw):
    configs = []
    for size in sizes:
        for length in lengths:
            log(f"{size} T={length}")
            configs.append(run_config(size, length, variants, log=log, **kw))
    return {"configs": configs}


def _range(values, digits):
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def markdown_table(result):
    """One row per (size, length, variant): speed (median over the timed rounds, min-max in
    brackets) and memory, each with its ratio to vanilla. A speed ratio's bracket is the
    min-max of the per-round ratios (rounds are interleaved, so round r of every variant ran
    under the same load); a ratio whose bracket contains 1.00 is within the noise."""
    lines = [
        "| size | T | variant | train tok/s (min–max) | x vanilla (per-round min–max) | peak MiB | x vanilla "
        "| saved act. MiB | x vanilla | beam sent/s (min–max) | x vanilla (per-round min–max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ratio(r, key):
        return f"{r[key]:.2f}" if r.get(key) is not None else "-"

    def rounds(c, v, key, work):
        return [work / t for t in c["variants"][v].get(key) or []]

    def speed(c, v, key, work, digits, median):
        per_round = rounds(c, v, key, work)
        return f"{median:.{digits}f}" + (f" ({_range(per_round, digits)})" if per_round else "")

    def speed_ratio(c, v, key, work, median_ratio):
        base, mine = rounds(c, "vanilla", key, work), rounds(c, v, key, work)
        text = "-" if median_ratio is None else f"{median_ratio:.2f}"
        if v == "vanilla" or not base or len(base) != len(mine):
            return text
        return text + f" ({_range([m / b for m, b in zip(mine, base)], 2)})"

    for c in result["configs"]:
        tokens = c["batch_sentences"] * c["length"]
        for v, r in c["variants"].items():
            peak = f"{r['peak_memory_mib']:.0f}" if r.get("peak_memory_mib") else "-"
            lines.append(
                f"| {c['size']} | {c['length']} | {v} "
                f"| {speed(c, v, 'train_step_seconds_all', tokens, 0, r['train_tokens_per_second'])} | "
                f"{speed_ratio(c, v, 'train_step_seconds_all', tokens, r.get('train_speed_ratio'))} | {peak} | "
                f"{ratio(r, 'peak_memory_ratio')} | {r['saved_activations_mib']:.0f} | {ratio(r, 'activation_ratio')} "
                f"| {speed(c, v, 'decode_seconds_all', c['decode_sentences'], 2, r['decode_sentences_per_second'])} | "
                f"{speed_ratio(c, v, 'decode_seconds_all', c['decode_sentences'], r.get('decode_speed_ratio'))} |"
            )
    return "\n".join(lines) + "\n"


def markdown(result):
    """The whole Markdown file: command, machine and ``markdown_table``."""
    return (f"Command: `{result['command']}`  \nMachine: {result['machine']}, torch {result['torch']}, "
            f"{result['threads']} threads, {result['device']} {result['dtype']}\n\n{markdown_table(result)}")


def write(result, json_path=None, md_path=None):
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if md_path:
        with open(md_path, "w") as f:
            f.write(markdown_table(result))
