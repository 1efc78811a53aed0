"""The RealFormer flags: which attention paths are residual, sum or mean, and the kernel.

Values stay plain strings in args/checkpoints (``"encoder,decoder,cross"``, ``"sum"``)
so checkpoints hold nothing but builtins; modules parse them with ``resolve``.
"""

import argparse
import logging
from typing import FrozenSet, NamedTuple, Optional

from .errors import ConfigError, FlagValueError
from .modules.residual_attention import KERNELS, RESIDUAL_MODES

PATHS = ("encoder", "decoder", "cross")
PATHS_FLAG = "--residual-attention-paths"
MODE_FLAG = "--residual-attention-mode"
KERNEL_FLAG = "--residual-attention-kernel"
DEFAULT_MODE = "sum"
DEFAULT_KERNEL = "auto"

logger = logging.getLogger(__name__)


class ResidualSettings(NamedTuple):
    paths: FrozenSet[str]
    mode: str
    kernel: str = DEFAULT_KERNEL  # how, not what: every kernel computes the same function

    def describe(self) -> str:
        return f"paths={format_paths(self.paths)}, mode={self.mode}, kernel={self.kernel}"

    def function(self):
        """What the model computes (the kernel only changes how)."""
        return (self.paths, self.mode)


def parse_paths(value) -> FrozenSet[str]:
    """``"encoder,cross"`` (or a list of words) -> frozenset; ``"none"`` -> empty."""
    words = value.split(",") if isinstance(value, str) else list(value)
    words = [w.strip().lower() for w in words if w.strip()]
    if not words:
        raise ConfigError(f"{PATHS_FLAG}: empty value; give a comma list of {', '.join(PATHS)}, or none")
    if words == ["none"]:
        return frozenset()
    if "none" in words:
        raise ConfigError(f"{PATHS_FLAG}: 'none' cannot be combined with other paths")
    for word in words:
        if word not in PATHS:
            raise ConfigError(
                f"{PATHS_FLAG}: unknown path {word!r} (choose from {', '.join(PATHS)}, or none)"
            )
    return frozenset(words)


def format_paths(paths) -> str:
    """Canonical string form, in encoder, decoder, cross order."""
    return ",".join(p for p in PATHS if p in paths) or "none"


def parse_mode(value) -> str:
    if value not in RESIDUAL_MODES:
        raise ConfigError(f"{MODE_FLAG}: unknown mode {value!r} (choose from {', '.join(RESIDUAL_MODES)})")
    return value


def parse_kernel(value) -> str:
    if value not in KERNELS:
        raise ConfigError(f"{KERNEL_FLAG}: unknown kernel {value!r} (choose from {', '.join(KERNELS)})")
    return value


def resolve(cfg, available=PATHS) -> ResidualSettings:
    """Validated settings from a model config or args namespace.

    ``available``: the paths the model has (``("encoder",)`` for an encoder-only model).
    A path on an attention the model does not have is an error, not a silent no-op.
    """
    paths = parse_paths(getattr(cfg, "residual_attention_paths", None) or ",".join(available))
    mode = parse_mode(getattr(cfg, "residual_attention_mode", None) or DEFAULT_MODE)
    kernel = parse_kernel(getattr(cfg, "residual_attention_kernel", None) or DEFAULT_KERNEL)
    missing = sorted(paths - set(available), key=PATHS.index)
    if missing:
        raise ConfigError(
            f"{PATHS_FLAG} includes {', '.join(missing)} but this model has only "
            f"{' and '.join(available)} attention paths (use {format_paths(available)} or none)"
        )
    if "cross" in paths and getattr(cfg, "no_cross_attention", False):
        raise ConfigError(
            f"{PATHS_FLAG} includes 'cross' but --no-cross-attention removes encoder-decoder attention"
        )
    return ResidualSettings(paths, mode, kernel)


def in_checkpoint(state) -> Optional[ResidualSettings]:
    """The settings a loaded checkpoint was trained with; vanilla ``transformer``
    checkpoints count as paths ``none``. None when the checkpoint holds no model config."""
    cfg = state.get("cfg")
    model_cfg = cfg.get("model") if cfg is not None else None
    if model_cfg is None:
        model_cfg = state.get("args")
    if model_cfg is None:
        return None
    if getattr(model_cfg, "residual_attention_paths", None) is None:
        return ResidualSettings(frozenset(), DEFAULT_MODE)
    return resolve(model_cfg)


def warn_if_changed(source: Optional[ResidualSettings], target: ResidualSettings, what="checkpoint"):
    """Log what changes when weights trained under ``source`` run under ``target``."""
    if source is None or source.function() == target.function():
        return
    changes = []
    if source.paths != target.paths:
        changes.append(f"residual paths {format_paths(source.paths)} -> {format_paths(target.paths)}")
    if source.mode != target.mode and (source.paths or target.paths):
        changes.append(f"mode {source.mode} -> {target.mode}")
    if changes:
        logger.warning(
            "%s was trained with different residual attention settings: %s; the loaded "
            "weights now compute a different function (fine for warm-starting, wrong for "
            "evaluating)", what, "; ".join(changes),
        )


CHECKPOINT_TAG = "realformer_trained_with"


def tag_checkpoint(state, path):
    """Note on ``state["model"]`` what the checkpoint was trained with, so the model
    it is loaded into can say what changed (see ``load_state_dict``). Plain strings
    only: the state may be re-pickled (broadcast to other ranks, weights-only)."""
    model_state = state.get("model")
    settings = in_checkpoint(state)
    if settings is not None and hasattr(model_state, "__dict__"):
        setattr(model_state, CHECKPOINT_TAG, (format_paths(settings.paths), settings.mode, str(path)))


def tagged_settings(state_dict):
    """``(ResidualSettings, checkpoint path)`` noted by ``tag_checkpoint``, or None."""
    tag = getattr(state_dict, CHECKPOINT_TAG, None)
    if tag is None:
        return None
    paths, mode, path = tag
    return ResidualSettings(parse_paths(paths), mode), path


def default_paths(args) -> str:
    """All paths the model has (``cross`` only when it has cross-attention)."""
    has_cross = not getattr(args, "no_cross_attention", False)
    return format_paths(p for p in PATHS if p != "cross" or has_cross)


def _argparse_type(parse, canonical=lambda v: v):
    """argparse ``type`` for a plugin flag: a bad value raises ``FlagValueError``, which
    argparse lets through, so the CLI prints one line naming the flag (``errors``) instead
    of fairseq's full usage followed by argparse's error."""
    def convert(value):
        try:
            return canonical(parse(value))
        except ConfigError as e:
            raise FlagValueError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


def argument_group(parser, title):
    """``parser.add_argument_group(title)``, or ``parser`` itself when it already is a group:
    fairseq hands a model's ``add_args`` its "Model-specific configuration" group, and argparse
    deprecates groups inside groups (their flags are missing from ``--help``)."""
    if isinstance(parser, argparse._ArgumentGroup):
        return parser
    return parser.add_argument_group(title)


def add_args(parser, available=PATHS):
    """The RealFormer flags; ``available``: the model's attention paths."""
    group = argument_group(parser, "RealFormer residual attention")
    names = {"encoder": "encoder (self-attention)", "decoder": "decoder (self-attention)",
             "cross": "cross (encoder-decoder attention)"}
    group.add_argument(
        PATHS_FLAG, type=_argparse_type(parse_paths, format_paths), metavar="PATHS",
        help="comma list of attention paths that pass their pre-softmax scores to the next "
             f"layer: {', '.join(names[p] for p in available)}, or none (the vanilla model). "
             "Default: every path the model has",
    )
    group.add_argument(
        MODE_FLAG, choices=RESIDUAL_MODES, type=_argparse_type(parse_mode),
        help="sum: softmax over the running sum of scores (the paper's default); "
             "mean: over the running mean, sum / number of terms in it (the paper's option for "
             "deep stacks). Default: sum",
    )
    group.add_argument(
        KERNEL_FLAG, choices=KERNELS, type=_argparse_type(parse_kernel),
        help="how residual attention is computed (all compute the same function): "
             "materialized (B x H x T x S float32 scores passed between layers, explicit softmax), "
             "bias (the previous layers' float32 sum enters PyTorch's scaled_dot_product_attention "
             "as an additive mask: no probabilities stored on CUDA), fused (concatenated "
             "queries/keys passed on, scaled_dot_product_attention; no T x S tensor stored), or "
             "auto (per path and call: the rule in modules/residual_attention/choice.py, measured on CPU; "
             "on CUDA the rule measured on a GPU, shipped in the package). Default: auto",
    )
