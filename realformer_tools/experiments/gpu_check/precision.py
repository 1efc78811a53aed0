"""Mixed precision judged against vanilla's own cost, measured the same way.

* ``--quick`` (:func:`checkpoint_shift_checks`): each fp32 checkpoint (vanilla ``transformer``
  and every kernel, trained in the same section) is evaluated on the validation set in
  float32, float16 and bfloat16 (the whole model cast, as ``--fp16`` / ``--bf16`` run it;
  log-probabilities in float32 as fairseq's); the valid nll's relative shift from float32 is
  the precision's cost for that model. A kernel passes when its shift is within
  ``max(0.5%, 1.5x vanilla's shift)``; vanilla is the yardstick (reported). One training run
  per precision cannot judge this: after 300 updates fairseq's own transformer trained in
  bf16 ended 6.28% from its fp32 run (H100, 2026-11-27), which is seed and trajectory, not
  arithmetic.
* The full check (:func:`seed_gap_checks`): several seeds of fp32 / fp16 / bf16 training;
  each kernel's gap (valid nll, precision minus fp32, relative) paired by seed with
  vanilla's: the mean difference at most two standard errors.
"""

import math
from typing import Dict, List

from .records import check
from .targets import judge_shift, seed_gap, shift_limit

EVAL_DTYPES = ("float32", "float16", "bfloat16")


def valid_nll(checkpoint: str, data: str, dtype: str, device: str, max_tokens: int = 4096) -> dict:
    """``{"nll", "tokens", "sentences"}``: the checkpoint's mean token nll (base 2, as fairseq
    logs ``nll_loss``) on the validation set, the model cast to ``dtype`` on ``device``."""
    import torch
    from fairseq import checkpoint_utils, utils

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].to(device=device, dtype=getattr(torch, dtype)).eval()
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    itr = task.get_batch_iterator(
        dataset, max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    total, tokens, sentences = 0.0, 0, 0
    with torch.no_grad():
        for sample in itr:
            if device != "cpu":
                sample = utils.move_to_cuda(sample)
            net_output = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
            target = sample["target"]
            nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            mask = target.ne(pad)
            total += float(nll[mask].double().sum())
            tokens += int(mask.sum())
            sentences += int(sample["nsentences"])
    del model, models
    return dict(nll=total / max(tokens, 1) / math.log(2), tokens=tokens, sentences=sentences)


def checkpoint_shift_checks(checkpoints: Dict[str, str], data: str, device: str, judged: bool,
                            log=print) -> List[dict]:
    """The quick check's precision checks from fp32 checkpoints (``{kernel: path}``,
    ``vanilla`` among them). ``judged``: False in the dry run on CPU (reported)."""
    evals = {}
    for kernel, path in checkpoints.items():
        evals[kernel] = {}
        for dtype in EVAL_DTYPES:
            evals[kernel][dtype] = valid_nll(path, data, dtype, device)
        log(f"precision: {kernel}: valid nll " + ", ".join(f"{d} {v['nll']:.4f}" for d, v in evals[kernel].items()))
    checks = []
    for dtype in EVAL_DTYPES[1:]:
        shifts = {k: abs(e[dtype]["nll"] - e["float32"]["nll"]) / e["float32"]["nll"] for k, e in evals.items()}
        vanilla = shifts.get("vanilla")
        for kernel, shift in shifts.items():
            name = f"{dtype} evaluation of the fp32 checkpoint ({kernel})"
            details = dict(kernel=kernel, dtype=dtype, shift=shift, nll=evals[kernel][dtype]["nll"],
                           fp32_nll=evals[kernel]["float32"]["nll"], tokens=evals[kernel][dtype]["tokens"],
                           vanilla_shift=vanilla)
            if kernel == "vanilla":
                checks.append(check(name, "reported", f"yardstick: fairseq's transformer moves {100 * shift:.3f}%",
                                    **details))
                continue
            if vanilla is None:
                checks.append(check(name, "failed", "vanilla's fp32 checkpoint is missing (no yardstick)", **details))
                continue
            limit = shift_limit(vanilla)
            details["limit"] = limit
            ok = judge_shift(shift, vanilla)
            text = f"{100 * shift:.3f}% (limit {100 * limit:.3f}%: max(0.5%, 1.5x vanilla's {100 * vanilla:.3f}%))"
            if not judged:
                checks.append(check(name, "reported", f"dry run: {text}; {'within' if ok else 'beyond'} the limit, "
                                    "reported, not judged (CPU, toy model)", **details))
            else:
                checks.append(check(name, "passed" if ok else "failed", None if ok else text, **details))
    return checks


def _gaps(nll, precision, kernel):
    """``{seed: (nll in precision - nll in fp32) / nll in fp32}`` of one kernel's runs."""
    return {s: (nll[(precision, kernel, s)] - nll[("fp32", kernel, s)]) / nll[("fp32", kernel, s)]
            for (p, k, s) in nll if p == precision and k == kernel and ("fp32", kernel, s) in nll}


def seed_gap_checks(runs: List[dict], judged: bool) -> List[dict]:
    """The full check's precision checks: per kernel and precision, the gap to fp32 over
    seeds (valid nll of the trained runs) against vanilla's (``targets.seed_gap``)."""
    nll = {}
    for c in runs:
        value = c.get("valid_nll", c.get("valid_loss"))
        if c.get("status") == "passed" and value is not None:
            nll[(c["precision"], c["kernel"], c.get("seed", 1))] = value
    kernels = sorted({k for _, k, _ in nll} - {"vanilla"})
    checks = []
    for precision in ("fp16", "bf16"):
        vanilla = _gaps(nll, precision, "vanilla")
        for kernel in kernels:
            mine = _gaps(nll, precision, kernel)
            if not mine:
                continue
            result = seed_gap(mine, vanilla)
            name = f"{precision} gap to fp32 over seeds ({kernel} vs vanilla)"
            details = dict(kernel=kernel, precision=precision, gaps=mine, vanilla_gaps=vanilla, **result)
            if result["met"] is None:
                checks.append(check(name, "reported", f"{len(result['seeds'])} paired seed(s): at least 2 are needed",
                                    **details))
            elif not judged:
                checks.append(check(name, "reported", "dry run: CPU toy runs, reported, not judged", **details))
            else:
                text = (f"mean gap {100 * result['kernel_mean']:+.2f}% vs vanilla's "
                        f"{100 * result['vanilla_mean']:+.2f}%: difference {100 * result['mean']:+.2f}% > 2 SE "
                        f"({100 * 2 * result['se']:.2f}%)")
                checks.append(check(name, "passed" if result["met"] else "failed",
                                    None if result["met"] else text, **details))
    return checks
