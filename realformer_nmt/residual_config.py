"""The RealFormer flags: which attention paths are residual, sum or mean, the kernel, and which paths
have value residual with which mix (plain strings in args and checkpoints, parsed with ``resolve``)."""

import argparse
import logging
from typing import FrozenSet, NamedTuple, Optional

from .errors import ConfigError, FlagValueError, one_line_errors
from .modules.residual_attention import KERNELS, RESIDUAL_MODES
from .modules.residual_attention.value_residual import VALUE_MIXES

PATHS = ("encoder", "decoder", "cross")
PATHS_FLAG = "--residual-attention-paths"
MODE_FLAG = "--residual-attention-mode"
KERNEL_FLAG = "--residual-attention-kernel"
VALUE_PATHS_FLAG = "--value-residual-paths"
VALUE_MIX_FLAG = "--value-residual-mix"
DEFAULT_MODE = "sum"
DEFAULT_KERNEL = "auto"
DEFAULT_VALUE_MIX = "learned"

logger = logging.getLogger(__name__)


class ResidualSettings(NamedTuple):
    paths: FrozenSet[str]
    mode: str
    kernel: str = DEFAULT_KERNEL  # how, not what: every kernel computes the same function
    value_paths: FrozenSet[str] = frozenset()  # value residual (ResFormer) on these paths
    value_mix: str = DEFAULT_VALUE_MIX

    def describe(self) -> str:
        value = f", value residual paths={format_paths(self.value_paths)}, mix={self.value_mix}" \
            if self.value_paths else ""
        return f"paths={format_paths(self.paths)}, mode={self.mode}, kernel={self.kernel}{value}"

    def function(self):
        """What the model computes (the kernel only changes how)."""
        return (self.paths, self.mode) + ((self.value_paths, self.value_mix) if self.value_paths else ())

    def value_mix_of(self, path: str) -> Optional[str]:
        """The value residual mix of ``path`` (None: no value residual there)."""
        return self.value_mix if path in self.value_paths else None


def parse_paths(value, flag=PATHS_FLAG) -> FrozenSet[str]:
    """``"encoder,cross"`` (or a list of words) -> frozenset; ``"none"`` -> empty."""
    words = value.split(",") if isinstance(value, str) else list(value)
    words = [w.strip().lower() for w in words if w.strip()]
    if not words:
        raise ConfigError(f"{flag}: empty value; give a comma list of {', '.join(PATHS)}, or none")
    if words == ["none"]:
        return frozenset()
    if "none" in words:
        raise ConfigError(f"{flag}: 'none' cannot be combined with other paths")
    for word in words:
        if word not in PATHS:
            raise ConfigError(f"{flag}: unknown path {word!r} (choose from {', '.join(PATHS)}, or none)")
    return frozenset(words)


def parse_value_paths(value) -> FrozenSet[str]:
    """``--value-residual-paths``: as :func:`parse_paths`."""
    return parse_paths(value, VALUE_PATHS_FLAG)


def parse_value_mix(value) -> str:
    if value not in VALUE_MIXES:
        raise ConfigError(f"{VALUE_MIX_FLAG}: unknown mix {value!r} (choose from {', '.join(VALUE_MIXES)})")
    return value


def format_paths(paths) -> str:
    """Canonical string form, in encoder, decoder, cross order."""
    return ",".join(p for p in PATHS if p in paths) or "none"


def parse_mode(value) -> str:
    if value not in RESIDUAL_MODES:
        raise ConfigError(f"{MODE_FLAG}: unknown mode {value!r} (choose from {', '.join(RESIDUAL_MODES)})")
    return value


REMOVED_KERNELS = ("fused",)  # a checkpoint that names one runs auto: every kernel computes the same function


def parse_kernel(value) -> str:
    if value in REMOVED_KERNELS:
        logger.warning("%s %s: that kernel was removed; auto runs instead (the same function)", KERNEL_FLAG, value)
        return DEFAULT_KERNEL
    if value not in KERNELS:
        raise ConfigError(f"{KERNEL_FLAG}: unknown kernel {value!r} (choose from {', '.join(KERNELS)})")
    return value


def resolve(cfg, available=PATHS) -> ResidualSettings:
    """Validated settings from a model config or args namespace; ``available``: the model's paths."""
    paths = parse_paths(getattr(cfg, "residual_attention_paths", None) or ",".join(available))
    mode = parse_mode(getattr(cfg, "residual_attention_mode", None) or DEFAULT_MODE)
    kernel = parse_kernel(getattr(cfg, "residual_attention_kernel", None) or DEFAULT_KERNEL)
    value_paths = parse_value_paths(getattr(cfg, "value_residual_paths", None) or "none")
    value_mix = parse_value_mix(getattr(cfg, "value_residual_mix", None) or DEFAULT_VALUE_MIX)
    for flag, asked in ((PATHS_FLAG, paths), (VALUE_PATHS_FLAG, value_paths)):
        missing = sorted(asked - set(available), key=PATHS.index)
        if missing:
            raise ConfigError(f"{flag} includes {', '.join(missing)} but this model has only "
                              f"{' and '.join(available)} attention paths (use {format_paths(available)} or none)")
        if "cross" in asked and getattr(cfg, "no_cross_attention", False):
            raise ConfigError(f"{flag} includes 'cross' but --no-cross-attention removes encoder-decoder attention")
    return ResidualSettings(paths, mode, kernel, value_paths, value_mix)


def warn_if_changed(source: Optional[ResidualSettings], target: ResidualSettings, what="The checkpoint being loaded"):
    """Log what changes when weights trained under ``source`` run under ``target``."""
    if source is None or source.function() == target.function():
        return
    changes = []
    if source.paths != target.paths:
        changes.append(f"residual paths {format_paths(source.paths)} -> {format_paths(target.paths)}")
    if source.mode != target.mode and (source.paths or target.paths):
        changes.append(f"mode {source.mode} -> {target.mode}")
    if source.value_paths != target.value_paths:
        changes.append(f"value residual paths {format_paths(source.value_paths)} -> {format_paths(target.value_paths)}")
    elif source.value_paths and source.value_mix != target.value_mix:
        changes.append(f"value residual mix {source.value_mix} -> {target.value_mix}")
    if changes:
        logger.warning("%s was trained with different residual attention settings: %s; the loaded weights now "
                       "compute a different function (fine for warm-starting, wrong for evaluating)", what,
                       "; ".join(changes))


CHECKPOINT_NOTE = "realformer_residual_attention"


def note_settings(model, state_dict, prefix, local_metadata):
    """``state_dict`` post-hook: notes ``model.residual`` (paths and mode; value residual paths and mix
    where there are any) in the state dict's metadata (docs/internals.md#flags-and-checkpoints)."""
    settings = model.residual
    value = f";{format_paths(settings.value_paths)};{settings.value_mix}" if settings.value_paths else ""
    local_metadata[CHECKPOINT_NOTE] = f"{format_paths(settings.paths)};{settings.mode}{value}"


def noted_settings(state_dict) -> Optional[ResidualSettings]:
    """The settings ``note_settings`` noted in ``state_dict``, or None."""
    metadata = getattr(state_dict, "_metadata", None) or {}
    for local in metadata.values():
        note = local.get(CHECKPOINT_NOTE) if isinstance(local, dict) else None
        if isinstance(note, str) and note.count(";") in (1, 3):
            paths, mode, *value = note.split(";")
            try:
                return ResidualSettings(parse_paths(paths), parse_mode(mode), DEFAULT_KERNEL,
                                        *((parse_value_paths(value[0]), parse_value_mix(value[1])) if value else ()))
            except ConfigError:
                return None
    return None


def warn_on_load(model, state_dict):
    """In a RealFormer model's ``load_state_dict``: warn when ``state_dict`` was noted with
    other residual settings than ``model`` computes with."""
    warn_if_changed(noted_settings(state_dict), model.residual)


def default_paths(args) -> str:
    """All paths the model has (``cross`` only when it has cross-attention)."""
    has_cross = not getattr(args, "no_cross_attention", False)
    return format_paths(p for p in PATHS if p != "cross" or has_cross)


def _argparse_type(parse, canonical=lambda v: v):
    """argparse ``type`` for a plugin flag: ``FlagValueError`` under the one-line error hook, else
    argparse's own error."""
    def convert(value):
        try:
            return canonical(parse(value))
        except ConfigError as e:
            if one_line_errors():
                raise FlagValueError(str(e)) from None
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


def argument_group(parser, title):
    """``parser.add_argument_group(title)``, or ``parser`` itself when it already is a group (argparse
    deprecates groups inside groups)."""
    if isinstance(parser, argparse._ArgumentGroup):
        return parser
    return parser.add_argument_group(title)


def add_args(parser, available=PATHS):
    """The RealFormer flags; ``available``: the model's attention paths."""
    group = argument_group(parser, "RealFormer residual attention")
    names = {"encoder": "encoder (self-attention)", "decoder": "decoder (self-attention)",
             "cross": "cross (encoder-decoder attention)"}
    group.add_argument(PATHS_FLAG, type=_argparse_type(parse_paths, format_paths), metavar="PATHS",
                       help="comma list of attention paths that pass their pre-softmax scores to the next "
                            f"layer: {', '.join(names[p] for p in available)}, or none (the vanilla model). "
                            "Default: every path the model has")
    group.add_argument(MODE_FLAG, choices=RESIDUAL_MODES, type=_argparse_type(parse_mode),
                       help="sum: softmax over the running sum of scores (the paper's default); "
                            "mean: over the running mean, sum / number of terms in it (the paper's option for "
                            "deep stacks). Default: sum")
    group.add_argument(KERNEL_FLAG, choices=KERNELS, type=_argparse_type(parse_kernel),
                       help="how residual attention is computed (all compute the same function): "
                            "materialized (B x H x T x S float32 scores passed between layers, explicit softmax), "
                            "bias (the previous layers' float32 sum as SDPA's additive mask), "
                            "triton (flash-style Triton kernels that read and write the float32 sum; pip install "
                            "'realformer-nmt[triton]'; where it does not apply, a call runs what auto would, said "
                            "once), or auto (materialized on CPU; on CUDA triton where it applies, else the rule "
                            "measured on a GPU and shipped in the package). Default: auto")
    group.add_argument(VALUE_PATHS_FLAG, type=_argparse_type(parse_value_paths, format_paths), metavar="PATHS",
                       help="value residual (ResFormer, Zhou et al. 2024): comma list of attention paths "
                            f"({', '.join(available)}) on which every layer after the first mixes the first layer's "
                            "values into its own before attention, V'_n = l1 V_n + l2 V_1; or none. Works with or "
                            "without residual scores. Default: none")
    group.add_argument(VALUE_MIX_FLAG, choices=VALUE_MIXES, type=_argparse_type(parse_value_mix),
                       help="the value residual's mix: half (l1 = l2 = 0.5, ResFormer's fixed form) or learned "
                            "(l1 = 1 - lambda, l2 = lambda, one lambda learned per layer and path from 0.5, as "
                            "modded-nanogpt's value residual). Default: learned")
