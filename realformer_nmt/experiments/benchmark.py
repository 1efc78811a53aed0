"""Training and decoding speed of RealFormer against fairseq's transformer, measured
in the same process on the same batches, reported as ratios (absolute times on a
shared machine are noise; ratios taken side by side are not)."""

import argparse
import statistics
import time
import types

import torch

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

VARIANTS = {
    "vanilla": ("transformer", {}),
    "realformer_none": ("realformer_transformer", {"residual_attention_paths": "none"}),
    "realformer_sum": ("realformer_transformer", {"residual_attention_mode": "sum"}),
    "realformer_mean": ("realformer_transformer", {"residual_attention_mode": "mean"}),
}


def build_model(arch, dictionary, dims, overrides, device, dtype):
    args = argparse.Namespace(**dims, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device=device, dtype=dtype)


def random_batch(dictionary, bsz, src_len, tgt_len, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    src[:, -1] = dictionary.eos()
    tgt[:, 0] = dictionary.eos()
    lengths = torch.full((bsz,), src_len)
    return src.to(device), lengths.to(device), tgt.to(device)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_train_step(model, batch, device):
    src, lengths, tgt = batch
    start = time.perf_counter()
    logits, _ = model(src, lengths, tgt)
    logits.float().logsumexp(-1).mean().backward()
    _sync(device)
    return time.perf_counter() - start


def time_generation(model, dictionary, batch, beam, device):
    src, lengths, _ = batch
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_b=src.size(1))
    start = time.perf_counter()
    with torch.no_grad():
        generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    _sync(device)
    return time.perf_counter() - start


def run_benchmark(dims, variants, bsz, src_len, tgt_len, steps, warmup, beam, vocab, device, dtype,
                  log=print):
    """Interleave the variants step by step (so machine load hits all alike) and
    return median times and ratios to ``vanilla``."""
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    models = {
        name: build_model(*VARIANTS[name][:1], dictionary, dims, VARIANTS[name][1], device, dtype).train()
        for name in variants
    }
    batch = random_batch(dictionary, bsz, src_len, tgt_len, device)
    train = {name: [] for name in variants}
    for step in range(warmup + steps):
        for name, model in models.items():
            t = time_train_step(model, batch, device)
            if step >= warmup:
                train[name].append(t)
        log(f"train step {step + 1}/{warmup + steps}")
    decode = {name: [] for name in variants}
    small = tuple(t[: max(1, bsz // 4)] for t in batch)
    for rep in range(3):
        for name, model in models.items():
            decode[name].append(time_generation(model.eval(), dictionary, small, beam, device))
        log(f"decode round {rep + 1}/3")
    result = {"device": str(device), "dtype": str(dtype).replace("torch.", ""), "dims": dims,
              "batch": {"bsz": bsz, "src_len": src_len, "tgt_len": tgt_len}, "beam": beam,
              "variants": {}}
    base_train = statistics.median(train["vanilla"]) if "vanilla" in train else None
    base_decode = statistics.median(decode["vanilla"]) if "vanilla" in decode else None
    for name in variants:
        tr, de = statistics.median(train[name]), statistics.median(decode[name])
        result["variants"][name] = {
            "train_step_seconds": tr,
            "decode_seconds": de,
            "train_time_ratio_to_vanilla": tr / base_train if base_train else None,
            "decode_time_ratio_to_vanilla": de / base_decode if base_decode else None,
        }
    return result
