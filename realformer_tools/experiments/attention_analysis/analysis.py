"""One checkpoint's analysis: load it through fairseq, batch a split deterministically,
stream every batch's attention into :class:`~.histograms.TypeStats`, and keep the
progress in a ``.npz`` so that an interrupted analysis resumes to the identical result."""

import hashlib
import io
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import numpy as np
import torch

from realformer_nmt.errors import CheckpointFileError, ConfigError, DataError

from .estimators import BIN_WIDTH, QUARTILES
from .histograms import TypeStats
from .recording import attention_modules, forward, model_inputs, recording_attention, restore_masked_tokens

Log = Callable[[str], None]

# What the two sets of statistics in attention_stats.json are (written into it).
STATISTIC_SETS = {
    "used": "<type>.entropy_*, <type>.jsd_*: the attention each layer attends with (RealFormer: "
            "softmax(mask(A_n / c_n)) of the running sum A_n = A_{n-1} + Q_n K_n^T / sqrt(d))",
    "own_scores": "<type>.own_scores.entropy_*, .jsd_*: the same statistics of each layer's own scores, "
                  "softmax(mask(Q_n K_n^T / sqrt(d))) with the layer's masks and no residual sum (the control); "
                  ".max_abs_difference_from_used: per layer, the largest |own - used| probability",
}


@dataclass
class Analysis:
    """The result for one checkpoint."""

    checkpoint: str
    label: str
    types: Dict[str, TypeStats]
    sentences: int = 0
    skipped: int = 0
    batches_done: int = 0
    total_batches: int = 0
    seconds: float = 0.0
    settings: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.batches_done >= self.total_batches

    def to_json(self) -> dict:
        out = {t: s.to_json() for t, s in self.types.items()}
        out["statistic_sets"] = STATISTIC_SETS
        out["checkpoint"] = self.checkpoint
        out["sentences"] = self.sentences
        return out

    def details(self) -> dict:
        return {
            "checkpoint": self.checkpoint, "label": self.label, "sentences": self.sentences,
            "skipped_too_long": self.skipped, "seconds": round(self.seconds, 2),
            "quantile_error_bound_nats": BIN_WIDTH,
            "quartiles": list(QUARTILES),
            "tokens": {t: s.tokens for t, s in self.types.items()},
            "layers": {t: s.layers for t, s in self.types.items()},
            "heads": {t: s.heads for t, s in self.types.items()},
            "max_probability_on_padding": {t: s.padding_mass for t, s in self.types.items()},
            **self.settings,
        }

    # resumable state: histograms + progress, one .npz
    def save(self, path: str) -> None:
        arrays = {}
        for t, s in self.types.items():
            for attr in ("entropy", "jsd", "own_entropy", "own_jsd"):
                arrays.update(getattr(s, attr).state(f"{t}.{attr}"))
            arrays[f"{t}.own_difference"] = s.own_difference
        meta = {
            "settings": self.settings, "batches_done": self.batches_done, "total_batches": self.total_batches,
            "sentences": self.sentences, "skipped": self.skipped, "seconds": self.seconds,
            "types": {t: [s.layers, s.heads, s.tokens, s.padding_mass] for t, s in self.types.items()},
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)

    def restore(self, path: str) -> bool:
        """Load saved progress if it was made with the same settings; True if loaded."""
        if not os.path.exists(path):
            return False
        try:
            with np.load(path) as arrays:
                meta = json.loads(bytes(arrays["meta"]).decode())
                if meta["settings"] != self.settings:
                    return False
                types = {}
                for t, (layers, heads, tokens, pad) in meta["types"].items():
                    s = TypeStats(layers, heads, tokens=tokens, padding_mass=pad)
                    for attr in ("entropy", "jsd", "own_entropy", "own_jsd"):
                        getattr(s, attr).load(arrays, f"{t}.{attr}")
                    s.own_difference = np.array(arrays[f"{t}.own_difference"])
                    types[t] = s
        except (OSError, ValueError, KeyError):
            return False
        self.types = types
        self.batches_done, self.total_batches = meta["batches_done"], meta["total_batches"]
        self.sentences, self.skipped, self.seconds = meta["sentences"], meta["skipped"], meta["seconds"]
        return True


def _file_identity(path: str) -> str:
    st = os.stat(path)
    return hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


def describe_model(model, cfg) -> str:
    """A short label: arch, backbone (Post-LN / Pre-LN) and residual settings if any."""
    from realformer_nmt.residual_config import ResidualSettings, format_paths

    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None) or type(model).__name__
    pre_ln = bool(getattr(cfg.model, "encoder_normalize_before", False))
    settings = next(
        (m.residual for m in model.modules() if isinstance(getattr(m, "residual", None), ResidualSettings)), None
    )
    label = f"{arch} ({'Pre-LN' if pre_ln else 'Post-LN'}"
    if settings is not None:
        label += f", residual {settings.mode}: {format_paths(settings.paths)}" if settings.paths else ", residual none"
    return label + ")"


def load_checkpoint(path: str, data: str, device: str = "cpu"):
    """``(model, task, cfg)`` through fairseq's own loader (the plugin's safe loading)."""
    from fairseq import checkpoint_utils  # realformer_nmt is imported: models registered, loading safe

    if not os.path.isfile(path):
        raise CheckpointFileError(f"--path: no checkpoint file {path!r}")
    if not os.path.isdir(data):
        raise DataError(f"--data: {data!r} is not a directory (give the fairseq data-bin the model was trained on)")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    model = models[0].to(device).eval()
    return model, task, cfg


def _batches(task, model, subset: str, max_sentences: Optional[int], batch_size: int, max_tokens: int):
    """Deterministic batches of the first ``max_sentences`` items of the split, shortest
    first; returns ``(dataset, batches, skipped_too_long)``."""
    from fairseq import utils

    try:
        task.load_dataset(subset)
    except FileNotFoundError as exc:
        raise DataError(f"--subset: no {subset!r} split in {task.cfg.data} ({exc})") from exc
    dataset = task.dataset(subset)
    n = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    if n == 0:
        raise DataError(f"--subset: the {subset!r} split of {task.cfg.data} is empty")
    indices = np.arange(n, dtype=np.int64)
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    if max_positions is not None:
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
    else:
        ignored = []
    sizes = np.array([dataset.num_tokens(i) for i in indices], dtype=np.int64)
    indices = indices[np.argsort(sizes, kind="stable")]
    batches = dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=batch_size)
    return dataset, [np.asarray(b) for b in batches], len(ignored)


def analyze_checkpoint(
    path: str,
    data: str,
    subset: str = "test",
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    max_tokens: int = 8192,
    device: str = "cpu",
    mlm_input: str = "original",
    state_path: Optional[str] = None,
    save_every: float = 60.0,
    label: Optional[str] = None,
    log: Log = print,
) -> Analysis:
    """Stream the attention statistics of one checkpoint over a data split.

    With ``state_path``, progress is saved there every ``save_every`` seconds, at the
    end and on interruption; a later call with the same settings resumes from it (or
    returns at once when it was complete). ``mlm_input`` (encoder-only models trained
    with a masked-LM task): ``original`` analyses the text with masked tokens restored,
    ``masked`` the input exactly as the task masks it.
    """
    from fairseq import utils

    if mlm_input not in ("original", "masked"):
        raise ConfigError(f"--mlm-input: {mlm_input!r} is not one of original, masked")
    model, task, cfg = load_checkpoint(path, data, device)
    modules = attention_modules(model)
    settings = {
        "checkpoint_identity": _file_identity(path), "data": os.path.abspath(data), "subset": subset,
        "max_sentences": max_sentences, "batch_size": batch_size, "max_tokens": max_tokens,
        "mlm_input": mlm_input, "bin_width": BIN_WIDTH,
    }
    analysis = Analysis(
        checkpoint=path, label=label or describe_model(model, cfg),
        types={t: TypeStats(len(ms), ms[0].num_heads) for t, ms in modules.items()},
        settings=settings,
    )
    resumed = state_path is not None and analysis.restore(state_path)
    if state_path is not None and os.path.exists(state_path) and not resumed:
        log(f"[{analysis.label}] {state_path} was made with other settings or another checkpoint: starting over")
    if resumed and analysis.complete:
        log(f"[{analysis.label}] already analysed ({analysis.sentences} sentences): {state_path}")
        return analysis

    dataset, batches, skipped = _batches(task, model, subset, max_sentences, batch_size, max_tokens)
    analysis.total_batches, analysis.skipped = len(batches), skipped
    if resumed:
        log(f"[{analysis.label}] resuming at batch {analysis.batches_done + 1}/{len(batches)}")
    else:
        analysis.batches_done = analysis.sentences = 0
    if skipped:
        log(f"[{analysis.label}] skipping {skipped} sentences longer than the model's max positions")
    pads = {"source": task.source_dictionary.pad()}
    if "decoder_self" in modules or "cross" in modules:
        pads["target"] = task.target_dictionary.pad()
    restore = mlm_input == "original" and "target" not in pads  # encoder-only: masked-LM inputs
    log(f"[{analysis.label}] {path}: {', '.join(f'{t} {s.layers}x{s.heads}' for t, s in analysis.types.items())} "
        f"(layers x heads); {subset}: {sum(len(b) for b in batches)} sentences in {len(batches)} batches")

    start, last_save, last_log = time.time(), time.time(), 0.0
    elapsed_before = analysis.seconds

    def consume(attention_type, layer, weights, own):
        analysis.types[attention_type].add_layer(layer, weights, own)

    try:
        with recording_attention(model, consume):
            for b in range(analysis.batches_done, len(batches)):
                sample = dataset.collater([dataset[int(i)] for i in batches[b]])
                if restore and not restore_masked_tokens(sample, pads["source"]):
                    if b == analysis.batches_done:
                        log(f"[{analysis.label}] no masked-LM target in the batches: analysing the input as given")
                if device != "cpu":
                    sample = utils.move_to_cuda(sample, device=torch.device(device))
                net_input, masks = model_inputs(model, sample, pads)
                for t, stats in analysis.types.items():
                    stats.begin_batch(*masks[t])
                forward(model, net_input)
                for stats in analysis.types.values():
                    stats.end_batch()
                analysis.batches_done = b + 1
                analysis.sentences += len(batches[b])
                analysis.seconds = elapsed_before + time.time() - start
                now = time.time()
                if now - last_log >= 10 or b + 1 == len(batches):
                    last_log = now
                    log(f"[{analysis.label}] batch {b + 1}/{len(batches)}, {analysis.sentences} sentences, "
                        f"{analysis.seconds:.1f} s")
                if state_path is not None and now - last_save >= save_every:
                    analysis.save(state_path)
                    last_save = now
    finally:
        if state_path is not None:
            analysis.save(state_path)
    return analysis
