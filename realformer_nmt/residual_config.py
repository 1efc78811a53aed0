"""The two RealFormer flags: which attention paths are residual, and sum or mean.

Values stay plain strings in args/checkpoints (``"encoder,decoder,cross"``, ``"sum"``)
so checkpoints hold nothing but builtins; modules parse them with ``resolve``.
"""

import argparse
import logging
from typing import FrozenSet, NamedTuple, Optional

from .errors import ConfigError
from .modules.residual_attention import RESIDUAL_MODES

PATHS = ("encoder", "decoder", "cross")
PATHS_FLAG = "--residual-attention-paths"
MODE_FLAG = "--residual-attention-mode"
DEFAULT_MODE = "sum"

logger = logging.getLogger(__name__)


class ResidualSettings(NamedTuple):
    paths: FrozenSet[str]
    mode: str

    def describe(self) -> str:
        return f"paths={format_paths(self.paths)}, mode={self.mode}"


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


def resolve(cfg) -> ResidualSettings:
    """Validated settings from a model config or args namespace.

    A path on an attention the model does not have is an error, not a silent no-op.
    """
    paths = parse_paths(getattr(cfg, "residual_attention_paths", ",".join(PATHS)))
    mode = parse_mode(getattr(cfg, "residual_attention_mode", DEFAULT_MODE))
    if "cross" in paths and getattr(cfg, "no_cross_attention", False):
        raise ConfigError(
            f"{PATHS_FLAG} includes 'cross' but --no-cross-attention removes encoder-decoder attention"
        )
    return ResidualSettings(paths, mode)


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
    if source is None or source == target:
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
    def convert(value):
        try:
            return canonical(parse(value))
        except ConfigError as e:
            # argparse prefixes the flag name itself.
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1])
    return convert


def add_args(parser):
    group = parser.add_argument_group("RealFormer residual attention")
    group.add_argument(
        PATHS_FLAG, type=_argparse_type(parse_paths, format_paths), metavar="PATHS",
        help="comma list of attention paths that pass their pre-softmax scores to the next "
             "layer: encoder (self-attention), decoder (self-attention), cross "
             "(encoder-decoder attention), or none (vanilla transformer). "
             "Default: every path the model has",
    )
    group.add_argument(
        MODE_FLAG, choices=RESIDUAL_MODES,
        help="sum: softmax over the running sum of scores (the paper's default); "
             "mean: over the running mean, sum / layer number (the paper's option for "
             "deep stacks). Default: sum",
    )
